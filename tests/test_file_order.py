"""make test's file order: longest recorded file first, each file's tests together."""

from __future__ import annotations

from pathlib import Path

from tests.file_order import longest_file_first, read_durations, write_durations

REPO = Path(__file__).resolve().parent.parent


def test_longest_file_first_keeps_each_file_together_and_unknown_files_at_the_median() -> None:
    nodeids = ["t/a.py::x", "t/a.py::y", "t/new.py::x", "t/b.py::x", "t/d.py::x", "t/c.py::x"]
    seconds = {"t/a.py": 1.0, "t/b.py": 30.0, "t/c.py": 8.0, "t/d.py": 5.0}  # median 6.5
    order = [nodeids[i] for i in longest_file_first(nodeids, seconds)]
    assert order == ["t/b.py::x", "t/c.py::x", "t/new.py::x", "t/d.py::x", "t/a.py::x", "t/a.py::y"]
    assert longest_file_first(nodeids, {}) == list(range(len(nodeids)))


def test_recording_merges_and_drops_files_that_are_gone(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    for name in ("kept.py", "rerun.py"):
        (tmp_path / "tests" / name).write_text("")
    path = tmp_path / "durations.json"
    path.write_text('{"tests/kept.py": 4.0, "tests/rerun.py": 9.0, "tests/gone.py": 2.0}')
    write_durations({"tests/rerun.py": 12.345}, tmp_path, path)
    assert read_durations(path) == {"tests/kept.py": 4.0, "tests/rerun.py": 12.3}


def test_the_recorded_order_names_this_repository_s_test_files() -> None:
    seconds = read_durations()
    assert len(seconds) > 50, "tests/file_durations.json: record it with --record-file-durations"
    assert [path for path in seconds if not (REPO / path).is_file()] == []
