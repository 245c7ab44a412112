"""Content fingerprints: sha256 over a file or a whole folder of files."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from registry.errors import InvalidInput

_CHUNK = 1 << 20
_SKIP_NAMES = {".git", "__pycache__", ".gitattributes", ".DS_Store"}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def tree_files(root: Path, *, regular_only: bool = False) -> list[Path]:
    """Files under root that define its content, in a stable order.

    `regular_only` (what the artifact store needs): a symlink or a special file (fifo, socket,
    device) anywhere under root is refused with `InvalidInput` naming it, instead of being
    followed (its target's bytes copied in) or silently left out.

    Otherwise (a base model, registered in place): symbolic links are followed only while they
    stay inside :func:`link_fence` of root - the folder itself, or the Hugging Face cache repo
    of a snapshot folder. A link that leaves it is refused with `InvalidInput` naming it, so
    registering a folder never hashes, uploads and caches on workers a file from elsewhere
    (`/etc/...`, the control plane's own secrets). Dangling links and special files are left
    out, as they are not content.
    """
    files = _regular_files(root) if regular_only else _contained_files(root)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _regular_files(folder: Path) -> list[Path]:
    found = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name in _SKIP_NAMES:
                continue
            path = Path(entry.path)
            if entry.is_symlink():
                raise InvalidInput(
                    f"{path} is a symbolic link (to {os.readlink(path)}); artifacts hold "
                    "regular files only: copy the file itself into the folder"
                )
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                found += _regular_files(path)
            elif stat.S_ISREG(mode):
                found.append(path)
            else:
                raise InvalidInput(
                    f"{path} is not a regular file (a fifo, socket or device); artifacts hold "
                    "regular files only"
                )
    return found


def link_fence(folder: Path) -> Path:
    """Where the symbolic links of a base-model folder may point: inside the folder itself, or,
    for a Hugging Face cache snapshot (`<cache>/models--org--name/snapshots/<revision>`, whose
    files link to `../../blobs/<sha256>`), inside that cache repo `models--org--name`."""
    real = folder.resolve()
    snapshots, repo = real.parent, real.parent.parent
    in_cache = snapshots.name == "snapshots" and repo.name.startswith("models--")
    return repo if in_cache and (repo / "blobs").is_dir() else real


def _contained_files(root: Path) -> list[Path]:
    fence = link_fence(root)
    found: list[Path] = []
    seen: set[Path] = set()  # real folders walked: a link back up must not loop

    def walk(folder: Path) -> None:
        real_folder = folder.resolve()
        if real_folder in seen:
            return
        seen.add(real_folder)
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name in _SKIP_NAMES:
                    continue
                path = Path(entry.path)
                if entry.is_symlink():
                    try:
                        target = path.resolve(strict=True)
                    except (OSError, RuntimeError):  # dangling, or a loop of links
                        continue
                    if not target.is_relative_to(fence):
                        raise InvalidInput(
                            f"{path} is a symbolic link to {target}, outside {fence}: a base "
                            "model's links may point only inside its folder (or, for a Hugging "
                            "Face cache snapshot, inside its cache repo); copy the file in"
                        )
                try:
                    mode = path.stat().st_mode
                except OSError:
                    continue
                if stat.S_ISDIR(mode):
                    walk(path)
                elif stat.S_ISREG(mode):
                    found.append(path)

    walk(root)
    return found


@dataclass(frozen=True)
class TreeDigest:
    sha256: str
    size_bytes: int
    files: int


def tree_sha256(root: Path, *, regular_only: bool = False) -> TreeDigest:
    """sha256 over (relative path, file sha256) of every file: renames and edits both count."""
    digest = hashlib.sha256()
    size = 0
    files = tree_files(root, regular_only=regular_only)
    for path in files:
        rel = path.relative_to(root).as_posix()
        digest.update(rel.encode())
        digest.update(b"\0")
        digest.update(file_sha256(path).encode())
        digest.update(b"\n")
        size += path.stat().st_size
    return TreeDigest(digest.hexdigest(), size, len(files))


@dataclass(frozen=True)
class SentenceTransformerInfo:
    dims: int | None
    max_seq_length: int | None


def read_sentence_transformer_info(root: Path) -> SentenceTransformerInfo:
    """Read dims and max sequence length from a sentence-transformers folder, without torch."""
    dims: int | None = None
    max_len: int | None = None
    bert_cfg = root / "sentence_bert_config.json"
    if bert_cfg.is_file():
        max_len = json.loads(bert_cfg.read_text()).get("max_seq_length")
    tok_cfg = root / "tokenizer_config.json"
    if max_len is None and tok_cfg.is_file():
        # sentence-transformers 6 keeps the limit on the tokenizer only; transformers writes a
        # huge sentinel when the tokenizer has none.
        limit = json.loads(tok_cfg.read_text()).get("model_max_length")
        if isinstance(limit, int) and limit < 1_000_000:
            max_len = limit
    modules = root / "modules.json"
    if modules.is_file():
        for module in json.loads(modules.read_text()):
            cfg = root / module.get("path", "") / "config.json"
            if not module.get("path") or not cfg.is_file():
                continue
            data = json.loads(cfg.read_text())
            for key in ("word_embedding_dimension", "embedding_dimension"):  # ST <6, ST 6
                if key in data:
                    dims = data[key]
            if "out_features" in data:  # a Dense layer after pooling changes the size
                dims = data["out_features"]
    return SentenceTransformerInfo(dims=dims, max_seq_length=max_len)


# The model library's artifact contract (serving/runtime/heads.py writes it): a folder may hold
# a peft LoRA (adapter_config.json) and/or a task head described by head.json.
HEAD_MANIFEST = "head.json"
LORA_CONFIG = "adapter_config.json"


def read_head_kind(folder: Path) -> str | None:
    """ "score" or "classify" for an artifact with a task head, None for a LoRA-only one."""
    manifest = folder / HEAD_MANIFEST
    if not manifest.is_file():
        return None
    try:
        kind = json.loads(manifest.read_text()).get("kind")
    except (json.JSONDecodeError, AttributeError):
        return "invalid"
    return kind if isinstance(kind, str) else "invalid"


def sequence_classifier_labels(folder: Path) -> int | None:
    """Number of labels of a transformers *ForSequenceClassification folder, else None."""
    config = folder / "config.json"
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text())
    except json.JSONDecodeError:
        return None
    architectures = data.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        return None
    labels = data.get("id2label") or {}
    return int(data.get("num_labels") or len(labels) or 2)
