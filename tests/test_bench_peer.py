"""Seconds-long smoke runs of benchmarks/peer.py and padding.py on the tiny model. peer.py
without infinity: the real stack (`taskfleet up`, serving the model's int8 variant: the plain
torch path is the e2e tests') through the stock openai client, every reply
checked against in-process, the report and its plot written; an engine that cannot run is
named in the report, not fatal."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import peer


@pytest.mark.bench  # ~40 s (`taskfleet up` and a variant build): make bench
def test_smoke_without_infinity(tmp_path: Path, tiny_model_path: Path) -> None:
    report = tmp_path / "peer.md"
    code = peer.main(
        [
            "--engines", "taskfleet-onnx-int8,infinity-torch",
            "--infinity-venv", str(tmp_path / "none"),
            "--base-path", str(tiny_model_path), "--passages", "24", "--concurrency", "4",
            "--rounds", "1", "--latency-requests", "3", "--report", "--report-path", str(report),
        ]
    )  # fmt: skip
    assert code == 0
    text = report.read_text()
    # The stack serving MiniLM's int8 variant (candidate add --variant), every reply checked
    # against the same variant in-process at the normal bound (int8 runs each text alone, so
    # its vectors do not depend on the batch), and the variant's distance from torch's given.
    assert "| taskfleet-onnx-int8 |" in text
    assert "51 checked, 0 wrong" in text  # 24 x 1 + 24 x 8 + 3 single requests
    assert "its in-process vectors vs torch's: cos mean" in text
    # Where the time went, from /proc and the sidecar's /metrics: the model's runtime named.
    assert "x 1 text: CPU-ms per text by process" in text and "runtime (model) " in text
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


def test_padding_benchmark_smoke(tmp_path: Path, tiny_model_path: Path) -> None:
    from benchmarks import padding

    report = tmp_path / "padding.md"
    code = padding.main(
        [
            "--base-path", str(tiny_model_path), "--passages", "40", "--rounds", "1",
            "--report", "--report-path", str(report),
        ]
    )  # fmt: skip
    assert code == 0
    text = report.read_text()
    # Cut by length, a call pads at most 10% and never more than the one-pass plan.
    for group in padding.GROUPS:
        old = float(text.split(f"| {group} texts | 1 | ")[1].split("x")[0])
        new = float(text.split(f"| {group} texts | 0.1 | ")[1].split("x")[0])
        assert new <= min(old, 1.10)
