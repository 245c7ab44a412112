"""Which code produced a record: stored with every eval run and every adapter.

Its home is the eval harness because both producers of such records use it: the eval runner,
and the fine-tuning pipeline (which already depends on evals for its data and its evaluation).
The registry only stores the string.
"""

from __future__ import annotations

import subprocess
from functools import lru_cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@lru_cache(maxsize=1)
def code_version() -> str:
    """`git describe` of the checkout when there is one, else the installed package version."""
    try:
        described = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--tags"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        if described:
            return f"git:{described}"
    except (OSError, subprocess.SubprocessError):
        pass
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"taskfleet=={version('taskfleet')}"
    except PackageNotFoundError:
        return "unknown"
