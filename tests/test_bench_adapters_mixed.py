"""Smoke run of benchmarks/adapters_mixed.py (make bench) on the tiny model: two real runtimes
(mixed and grouped), three adapters, every row of the first round compared between them."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import adapters_mixed


@pytest.mark.bench  # ~1 min (two runtimes) on the shared 2-core machine: make bench
def test_adapters_benchmark_smoke(tmp_path: Path, tiny_model_path: Path) -> None:
    report = tmp_path / "adapters.md"
    code = adapters_mixed.main(
        [
            "--base-path", str(tiny_model_path), "--passages", "24", "--adapters", "1,3",
            "--rows", "8", "--rank", "4", "--rounds", "1", "--report", "--report-path", str(report),
        ]
    )  # fmt: skip
    assert code == 0
    text = report.read_text()
    assert "| 3 | " in text and "| 1 | " in text
    assert "48 rows of the first round compared between the two runtimes,\n  0 further" in text
    assert "**3 adapters mixed uniformly: " in text


def test_bad_adapter_counts_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        adapters_mixed.parse_args(["--adapters", "1,x"])
    assert "comma-separated counts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        adapters_mixed.parse_args(["--adapters", "0,8"])
    assert "must be >= 1" in capsys.readouterr().err
