"""Seconds-long smoke run of benchmarks/lora_memory.py (the real CLI under /usr/bin/time -v),
on a tiny model and a generated suite folder, so the measurement cannot rot."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import lora_memory
from tests.beir_fixture import build_beir


def test_parse_time_v_reads_the_peak() -> None:
    text = "\tMaximum resident set size (kbytes): 1817456\n\tExit status: 0\n"
    assert lora_memory.parse_time_v(text) == 1817456 * 1024
    with pytest.raises(SystemExit, match="no maximum resident set size"):
        lora_memory.parse_time_v("nothing here")


@pytest.mark.bench  # ~45 s (fine-tune + eval CLI): make bench
def test_smoke_measures_the_cli_and_writes_the_report(
    tmp_path: Path, tiny_model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # german-legal-retrieval lives at <data root>/gerlayqa/beir; dev holds a batch of 32 pairs.
    build_beir(tmp_path / "data" / "gerlayqa" / "beir", queries={"eval": 4, "dev": 40})
    report = tmp_path / "lora-memory.md"
    code = lora_memory.main(
        [
            "--base-path", str(tiny_model_path), "--data-dir", str(tmp_path / "data"),
            "--max-steps", "1", "--eval-sample", "4", "--threads", "1",
            "--report", "--report-path", str(report),
        ]
    )  # fmt: skip
    assert code == 0
    assert "maximum resident set size" in capsys.readouterr().out
    text = report.read_text()
    assert "| under 4 GB | **yes** |" in text
    assert "taskfleet finetune lora bench-memory --base bench-base --preset epoch" in text
    assert "--max-steps 1" in text
