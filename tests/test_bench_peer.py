"""Seconds-long smoke run of benchmarks/peer.py on the tiny model, without infinity: the real
stack (`taskfleet up`) through the stock openai client, every reply checked against in-process,
the report and its plot written; an engine that cannot run is named in the report, not fatal."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import peer


def test_smoke_without_infinity(tmp_path: Path, tiny_model_path: Path) -> None:
    report = tmp_path / "peer.md"
    code = peer.main(
        [
            "--engines", "taskfleet,infinity-torch", "--infinity-venv", str(tmp_path / "none"),
            "--base-path", str(tiny_model_path), "--passages", "24", "--concurrency", "4",
            "--rounds", "1", "--latency-requests", "3", "--report", "--report-path", str(report),
        ]
    )  # fmt: skip
    assert code == 0
    text = report.read_text()
    assert "| taskfleet |" in text
    assert "51 checked, 0 wrong" in text  # 24 x 1 + 24 x 8 + 3 single requests
    assert "**infinity-torch not measured**: no infinity-emb in" in text
    assert "No peer was measured in this run" in text
    assert (tmp_path / "peer.png").stat().st_size > 1000


def test_unknown_engines_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        peer.parse_args(["--engines", "taskfleet,tei"])
    assert "unknown engine(s) tei" in capsys.readouterr().err


def test_a_wrong_vector_is_counted() -> None:
    import numpy as np

    reference = peer.Reference(np.eye(3, dtype=np.float32), min_cos=0.9999)
    good = reference.check([0, 2], np.asarray([[2.0, 0, 0], [0, 0, 1.0]]))
    assert (good.replies, good.wrong, good.min_cos) == (2, 0, 1.0)
    bad = reference.check([1], np.asarray([[0.1, 1.0, 0]]))
    assert bad.wrong == 1 and bad.min_cos < 0.9999
