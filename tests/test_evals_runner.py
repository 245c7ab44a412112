"""The eval runner against a real registry (SQLite) and MLflow store; the CLI as users run it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from evals.errors import EvalInterrupted, SplitLeakError
from evals.runner import EvalPaths, compare, leaderboard, run_eval
from evals.suites import declare
from registry import Registry
from registry.entities import TrainingRecord
from testbed.tiny_model import build_tiny_adapter
from tests.beir_fixture import build_beir

TASK = "legal"
SUITE = "legal-suite"  # a user-declared suite over the fixture folder


@pytest.fixture
def beir(tmp_path: Path) -> Path:
    return build_beir(tmp_path / "beir", queries={"eval": 24, "dev": 12})


@pytest.fixture
def reg(tmp_path: Path, tiny_model_path: Path, beir: Path) -> Iterator[Registry]:
    registry = Registry.open(
        f"sqlite:///{tmp_path / 'registry.db'}", artifact_dir=tmp_path / "artifacts", actor="test"
    )
    create, _ = declare(SUITE, "retrieval", beir, test_split="eval", train_split="dev")
    registry.add_suite(create)
    registry.add_task(TASK, suite=SUITE)
    registry.add_model("tiny", path=tiny_model_path)
    registry.add_candidate(TASK, name="tiny-base", base="tiny")
    registry.add_candidate(TASK, name="bm25", kind="bm25")
    try:
        yield registry
    finally:
        registry.close()


def _paths(tmp_path: Path, beir: Path, *, mlflow: bool = False) -> EvalPaths:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}" if mlflow else None
    return EvalPaths(cache_dir=tmp_path / "cache", mlflow_uri=uri)


def _adapter(reg: Registry, tmp_path: Path, name: str, split: str, parent: str | None) -> None:
    folder = build_tiny_adapter(reg.model_path("tiny"), tmp_path / name, seed=len(name))
    training = TrainingRecord(
        data_fingerprint="f" * 64,
        train_split=split,
        hyperparameters={"r": 4},
        seed=1,
        code_version="test",
        suite=SUITE,
    )
    reg.register_adapter(name, base="tiny", source_dir=folder, training=training, parent=parent)


def test_run_is_recorded_complete_and_logged_to_mlflow(
    reg: Registry, beir: Path, tmp_path: Path
) -> None:
    run = run_eval(reg, TASK, "tiny-base", _paths(tmp_path, beir, mlflow=True))
    assert run.split == "eval" and run.suite_name == SUITE
    assert len(run.per_query) == 24 and run.sample_size is None
    assert run.model_fingerprint == reg.get_model("tiny").sha256
    assert run.ci["ndcg_at_10"][0] <= run.metrics["ndcg_at_10"] <= run.ci["ndcg_at_10"][1]
    assert run.cost["items_per_s"] > 0
    assert reg.list_eval_runs(TASK, "tiny-base")[0].id == run.id

    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    logged = client.get_run(run.mlflow_run_id or "")
    assert logged.data.metrics["ndcg_at_10"] == pytest.approx(run.metrics["ndcg_at_10"])
    assert logged.data.params["suite_fingerprint"] == run.suite_fingerprint
    artifact_dir = Path(client.download_artifacts(logged.info.run_id, "", str(tmp_path / "dl")))
    assert "tiny-base" in (artifact_dir / "report.md").read_text()
    assert not Path("mlruns").exists()  # artifacts stay beside the tracking database


def test_split_trained_on_by_the_lineage_is_refused(
    reg: Registry, beir: Path, tmp_path: Path
) -> None:
    _adapter(reg, tmp_path, "on-dev", "dev", None)
    _adapter(reg, tmp_path, "on-eval", "eval", None)
    _adapter(reg, tmp_path, "dev-child", "dev", "on-eval")  # clean itself, ancestor is not
    for name in ("on-dev", "on-eval", "dev-child"):
        reg.add_candidate(TASK, name=name, adapter=name)
    paths = _paths(tmp_path, beir)

    with pytest.raises(SplitLeakError, match="refusing to score split 'eval'"):
        run_eval(reg, TASK, "on-eval", paths)
    with pytest.raises(SplitLeakError):
        run_eval(reg, TASK, "dev-child", paths)
    with pytest.raises(SplitLeakError, match="'dev'"):
        run_eval(reg, TASK, "on-dev", paths, split="dev")
    assert reg.list_eval_runs(TASK) == []

    run = run_eval(reg, TASK, "on-dev", paths)
    assert run.adapter_fingerprint == reg.get_adapter("on-dev").sha256


def test_interrupted_run_records_nothing(reg: Registry, beir: Path, tmp_path: Path) -> None:
    def interrupt(phase: str, advance: int, total: int) -> None:
        if phase == "query":
            raise KeyboardInterrupt

    with pytest.raises(EvalInterrupted, match="no eval run was recorded"):
        run_eval(reg, TASK, "tiny-base", _paths(tmp_path, beir), progress=interrupt)
    assert reg.list_eval_runs(TASK) == []


def test_leaderboard_and_paired_compare(reg: Registry, beir: Path, tmp_path: Path) -> None:
    paths = _paths(tmp_path, beir)
    sampled = run_eval(reg, TASK, "bm25", paths, sample=10)
    assert sampled.sample_size == 10 and len(sampled.per_query) == 10
    bm25 = run_eval(reg, TASK, "bm25", paths)
    base = run_eval(reg, TASK, "tiny-base", paths)
    on_dev = run_eval(reg, TASK, "bm25", paths, split="dev")  # allowed: bm25 trained on nothing
    assert on_dev.split == "dev" and len(on_dev.per_query) == 12
    board = leaderboard(reg, TASK)  # test-split runs only
    assert {name: run.id for name, run in board.items()} == {"bm25": bm25.id, "tiny-base": base.id}

    result = compare(reg, TASK, "bm25", "tiny-base")
    assert result.shared_queries == 24
    expected = bm25.metrics["ndcg_at_10"] - base.metrics["ndcg_at_10"]
    assert result.difference.estimate == pytest.approx(expected)
    assert result.difference.low <= expected <= result.difference.high


def test_the_runner_asks_for_the_auto_promotion_of_a_task_that_opted_in(
    reg: Registry, beir: Path, tmp_path: Path
) -> None:
    """Recording never promotes by itself; the runner's next step does, for opted-in tasks."""
    paths = _paths(tmp_path, beir)
    reg.add_task("auto-legal", suite=SUITE, auto_promote=True)
    reg.add_candidate("auto-legal", name="tiny-base", base="tiny")
    run = run_eval(reg, "auto-legal", "tiny-base", paths)
    promoted = reg.list_promotions("auto-legal")
    assert [(p.candidate, p.actor, p.eval_run_ids) for p in promoted] == [
        ("tiny-base", "system:auto-promote", [run.id])
    ]
    run_eval(reg, TASK, "tiny-base", paths)  # the same model on a task that did not opt in
    assert reg.champion(TASK) is None


# ---- the CLI, as a user runs it ----------------------------------------------------------
def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TASKFLEET_HOME": str(home), "COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "taskfleet", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # a dozen CLI subprocesses, ~1 minute on two cores
def test_cli_run_leaderboard_compare_report(
    beir: Path, tmp_path: Path, tiny_model_path: Path
) -> None:
    home = tmp_path / "home"
    for args in (
        ("suite", "add", SUITE, "--kind", "retrieval", "--path", str(beir), "--test-split", "eval"),
        ("task", "add", TASK, "--suite", SUITE),
        ("model", "add", "tiny", "--path", str(tiny_model_path)),
        ("candidate", "add", TASK, "--name", "tiny-base", "--base", "tiny"),
        ("candidate", "add", TASK, "--name", "bm25", "--kind", "bm25"),
    ):
        r = _cli(home, *args)
        assert r.returncode == 0, r.stderr

    for cand in ("bm25", "tiny-base"):
        r = _cli(home, "eval", "run", TASK, "--candidate", cand)
        assert r.returncode == 0, r.stderr
        assert "ndcg_at_10 (main):" in r.stdout and "items/s" in r.stdout

    r = _cli(home, "eval", "leaderboard", TASK)
    assert r.returncode == 0 and "bm25" in r.stdout and "tiny-base" in r.stdout
    r = _cli(home, "eval", "compare", TASK, "bm25", "tiny-base")
    assert r.returncode == 0, r.stderr
    assert "over 24 shared queries" in r.stdout
    r = _cli(home, "eval", "report", TASK, "--out-dir", str(tmp_path / "reports"))
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "reports" / TASK / "leaderboard.md").read_text()
    assert "| 1 |" in md and "tiny-base" in md and "[" in md
    png = tmp_path / "reports" / TASK / "leaderboard.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Cost beside quality: serving cost columns, and the quality-vs-cost chart.
    assert "| CPU ms/item | peak MB | $/1M items |" in md and "quality-cost.png" in md
    chart = tmp_path / "reports" / TASK / "quality-cost.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # bad input: one line on stderr, non-zero exit, no traceback
    bad = [
        ("eval", "run", TASK, "--candidate", "nope"),
        ("eval", "run", TASK, "--candidate", "bm25", "--suite-path", str(tmp_path / "missing")),
        ("eval", "run", TASK, "--candidate", "bm25", "--split", "x"),
        ("eval", "compare", TASK, "bm25", "nope"),
    ]
    (tmp_path / "missing").mkdir()
    for args in bad:
        r = _cli(home, *args)
        assert r.returncode != 0, args
        assert "Traceback" not in r.stderr, args
        assert len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


@pytest.mark.candle
def test_a_candidate_is_scored_through_the_candle_runtime(
    reg: Registry, beir: Path, tmp_path: Path
) -> None:
    """`eval run --runtime candle` scores through the sidecar's Candle backend: same metrics as
    torch for the same weights, recorded with its runtime, in its own cache namespace."""
    from evals.errors import CandidateError
    from serving.runtime.remote import RuntimeTarget
    from taskfleet.stack import find_sidecar_binary

    paths = _paths(tmp_path, beir)
    candle = RuntimeTarget("candle", find_sidecar_binary())
    with pytest.raises(CandidateError, match="not marked as servable by the candle runtime"):
        run_eval(reg, TASK, "tiny-base", paths, runtime=candle)
    reg.set_model_runtimes("tiny", ["torch", "candle"])
    torch_run = run_eval(reg, TASK, "tiny-base", paths)
    candle_run = run_eval(reg, TASK, "tiny-base", paths, runtime=candle)
    assert (torch_run.runtime, candle_run.runtime) == ("torch", "candle")
    assert candle_run.cost["encoded_items"] > 0, "candle must not reuse torch's cached vectors"
    assert abs(candle_run.main_score - torch_run.main_score) < 0.001
    with pytest.raises(CandidateError, match="bm25 candidate has no model"):
        run_eval(reg, TASK, "bm25", paths, runtime=candle)
