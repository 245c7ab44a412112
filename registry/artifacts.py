"""Content-addressed artifact store: folders stored by their sha256 and verified on read."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from registry.errors import ArtifactError, InvalidInput
from registry.fingerprint import TreeDigest, tree_sha256


class ArtifactStore:
    """A local directory `<root>/sha256/<digest>/` per stored folder; never modified in place."""

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser()

    def path_for(self, sha256: str) -> Path:
        return self.root / "sha256" / sha256

    def put_dir(self, source: Path) -> TreeDigest:
        """Copy a folder into the store; idempotent for identical content."""
        if not source.is_dir():
            raise InvalidInput(f"artifact folder does not exist: {source}")
        # Links and special files are refused, never followed: a link to /etc/passwd in an
        # adapter folder must not copy that file into the store.
        digest = tree_sha256(source, regular_only=True)
        if digest.files == 0:
            raise InvalidInput(f"artifact folder is empty: {source}")
        target = self.path_for(digest.sha256)
        if target.is_dir():
            self.verify(digest.sha256)
            return digest
        target.parent.mkdir(parents=True, exist_ok=True)
        # Copy next to the target, then rename: a crash never leaves a half-written artifact
        # under its final name, and two writers of the same content both end up with one copy.
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
        try:
            # A link that appeared since the check is copied as a link and refused below.
            shutil.copytree(source, staging, symlinks=True, dirs_exist_ok=True)
            copied = tree_sha256(staging, regular_only=True)
            if copied.sha256 != digest.sha256:
                raise ArtifactError(f"artifact changed while it was being stored: {source}")
            try:
                os.rename(staging, target)
            except OSError:
                if not target.is_dir():
                    raise
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        return digest

    def verify(self, sha256: str) -> Path:
        """Return the stored folder after checking its content still matches its name."""
        path = self.path_for(sha256)
        if not path.is_dir():
            raise ArtifactError(f"artifact {sha256[:12]} is missing from the store at {path}")
        actual = tree_sha256(path, regular_only=True).sha256
        if actual != sha256:
            raise ArtifactError(
                f"artifact {sha256[:12]} is corrupted: its content hashes to {actual[:12]}"
            )
        return path
