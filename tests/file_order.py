"""The order make test runs test files in: longest first, from a recorded run's seconds per file.

pytest-xdist hands whole files (``--dist loadfile``) to its workers in collection order when
make test passes ``--no-loadscope-reorder`` (its default orders files by how many tests they
hold, which put the long one-test fleet files last: the run ended on one worker finishing them
while the others idled). ``file_durations.json`` holds each file's seconds (setup, call and
teardown of all its tests) from ``pytest --record-file-durations``; a file it does not know
counts as the median. Only whole files move: a file's tests keep their order and stay together.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

FILE_DURATIONS = Path(__file__).with_name("file_durations.json")


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def read_durations(path: Path = FILE_DURATIONS) -> dict[str, float]:
    return json.loads(path.read_text()) if path.is_file() else {}


def longest_file_first(nodeids: Sequence[str], seconds: Mapping[str, float]) -> list[int]:
    """Indexes of ``nodeids`` in run order (a stable sort on each file's expected seconds)."""
    unknown = statistics.median(seconds.values()) if seconds else 0.0
    return sorted(range(len(nodeids)), key=lambda i: -seconds.get(file_of(nodeids[i]), unknown))


def write_durations(recorded: Mapping[str, float], repo: Path, path: Path = FILE_DURATIONS) -> None:
    """Merge a run's seconds per file into ``path``; files that no longer exist are dropped."""
    seconds = {**read_durations(path), **{p: round(s, 1) for p, s in recorded.items()}}
    kept = {p: s for p, s in sorted(seconds.items()) if (repo / p).is_file()}
    path.write_text(json.dumps(kept, indent=1) + "\n")
