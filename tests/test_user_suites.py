"""The acceptance path of user-declared suites, through the CLI: a retrieval, a rerank and a
classification folder are registered, evaluated and ranked (the CLI app in-process, to spare
thirty interpreter starts); bad input, run as a user runs it (`python -m taskfleet`), gives one
clear line and records nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from registry import Registry
from tests.beir_fixture import build_beir
from tests.kinds_fixture import build_classification, build_rerank

REPO = Path(__file__).resolve().parent.parent


def tf(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TASKFLEET_HOME": str(home), "COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "taskfleet", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def ok(home: Path, *args: str) -> str:
    """One CLI command through the Typer app in this process."""
    from typer.testing import CliRunner

    from taskfleet.cli import app
    from taskfleet.context import state

    result = CliRunner().invoke(app, ["--home", str(home), *args], env={"COLUMNS": "200"})
    if state._registry is not None:
        state._registry.close()
    state._registry, state._settings = None, None  # the next command opens its own
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, (args, result.output)
    return result.output


def snapshot(home: Path) -> tuple[int, ...]:
    """Everything a refused command must leave as it was."""
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    try:
        tasks = reg.list_tasks()
        return (
            sum(len(reg.suite_versions(s.name)) for s in reg.list_suites()),
            len(tasks),
            sum(len(reg.list_candidates(t.name)) for t in tasks),
            sum(len(reg.list_eval_runs(t.name)) for t in tasks),
            len(reg.list_adapters()),
            len(reg.audit_log(limit=10_000)),
        )
    finally:
        reg.close()


def refused(home: Path, message: str, *args: str) -> None:
    before = snapshot(home)
    result = tf(home, *args)
    assert result.returncode == 1, (args, result.stdout)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], (args, result.stderr)
    assert snapshot(home) == before, f"{args} recorded something"


@pytest.mark.slow  # a dozen CLI subprocesses
def test_declare_evaluate_and_rank_three_kinds(
    tmp_path: Path, tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from taskfleet.context import state

    monkeypatch.setattr(state, "overrides", {})
    monkeypatch.setattr(state, "_settings", None)
    monkeypatch.setattr(state, "_registry", None)
    home = tmp_path / "home"
    faq = build_beir(tmp_path / "faq", queries={"test": 10, "train": 8})
    rr = build_rerank(tmp_path / "rr", queries={"test": 10, "train": 8})
    tickets = build_classification(tmp_path / "tickets", splits={"test": 24, "train": 30})

    ok(home, "suite", "add", "faq", "--kind", "retrieval", "--path", str(faq))
    ok(home, "suite", "add", "rr", "--kind", "rerank", "--path", str(rr))
    out = ok(home, "suite", "add", "tickets", "--kind", "classification", "--path", str(tickets))
    assert "suite tickets version 1 registered" in out and "test: 24 items, 3 labels" in out
    listing = ok(home, "suite", "ls")
    for name, kind in (("faq", "retrieval"), ("rr", "rerank"), ("tickets", "classification")):
        assert name in listing and kind in listing
    ok(home, "model", "add", "tiny", "--path", str(tiny_model_path))
    for suite in ("faq", "rr", "tickets"):
        ok(home, "task", "add", f"{suite}-task", "--suite", suite)
    candidates = {
        "faq-task": [("--kind", "bm25"), ("--base", "tiny")],
        "rr-task": [
            ("--kind", "bm25"),
            ("--kind", "random"),
            ("--kind", "embedding", "--base", "tiny"),
        ],
        "tickets-task": [("--kind", "majority"), ("--kind", "tfidf-lr")],
    }
    for task, options in candidates.items():
        for option in options:
            ok(home, "candidate", "add", task, *option)
    head = ok(
        home,
        "finetune",
        "head",
        "tickets-task",
        "--base",
        "tiny",
        "--name",
        "tiny-head",
        "--no-mlflow",
    )
    assert "candidate tiny+tiny-head" in head and "tickets/test: macro_f1" in head
    names = {
        "faq-task": ["bm25", "tiny"],
        "rr-task": ["bm25", "random", "tiny"],
        "tickets-task": ["majority", "tfidf-lr"],
    }
    for task, cands in names.items():
        for cand in cands:
            ok(home, "eval", "run", task, "-c", cand, "--no-mlflow")
    boards = {task: ok(home, "eval", "leaderboard", task) for task in names}
    assert "ndcg_at_10" in boards["faq-task"] and "ndcg_at_10" in boards["rr-task"]
    assert "macro_f1" in boards["tickets-task"] and "tiny+tiny-head" in boards["tickets-task"]
    assert boards["tickets-task"].index("tfidf-lr") < boards["tickets-task"].index("majority")
    show = ok(home, "task", "show", "rr-task")
    assert "suite rr version 1" in show

    # Bad input: one clear line, nothing recorded.
    missing = shutil.copytree(rr, tmp_path / "rr-missing")
    (missing / "queries.jsonl").unlink()
    refused(home, "missing file: ", "suite", "add", "rr2", "--kind", "rerank", "--path",
            str(missing))  # fmt: skip
    unknown = shutil.copytree(tickets, tmp_path / "unknown-label")
    with (unknown / "train.jsonl").open("a") as fh:
        fh.write(json.dumps({"id": "x1", "text": "steuer", "label": "steuer"}) + "\n")
    refused(home, "train.jsonl:31: unknown label 'steuer'", "suite", "add", "tickets", "--kind",
            "classification", "--path", str(unknown))  # fmt: skip
    duplicate = shutil.copytree(tickets, tmp_path / "duplicate-id")
    first = (duplicate / "test.jsonl").read_text().splitlines()[0]
    with (duplicate / "test.jsonl").open("a") as fh:
        fh.write(first + "\n")
    refused(home, "test.jsonl:25: duplicate id 'test-000' (first on line 1)", "suite", "add",
            "t3", "--kind", "classification", "--path", str(duplicate))  # fmt: skip
    empty = shutil.copytree(tickets, tmp_path / "empty-split")
    (empty / "test.jsonl").write_text("")
    refused(home, "split 'test' is empty", "suite", "add", "t4", "--kind", "classification",
            "--path", str(empty))  # fmt: skip
    refused(home, "has no classification split 'holdout' (splits found: test, train)", "suite",
            "add", "t5", "--kind", "classification", "--path", str(tickets), "--test-split",
            "holdout")  # fmt: skip
    refused(home, "candidate kind 'bm25' does not fit task 'tickets-task'", "candidate", "add",
            "tickets-task", "--kind", "bm25")  # fmt: skip
    refused(home, "adapter 'tiny-head' has a 'classify' head; a cross-encoder candidate",
            "candidate", "add", "rr-task", "--adapter", "tiny-head")  # fmt: skip
    refused(home, "unknown suite 'nope'", "task", "add", "t6", "--suite", "nope")

    # The same folder again is the same version; a changed folder is version 2.
    assert "is unchanged: version 1" in ok(
        home, "suite", "add", "tickets", "--kind", "classification", "--path", str(tickets)
    )
    with (tickets / "test.jsonl").open("a") as fh:
        fh.write(json.dumps({"id": "new-1", "text": "miete wohnung", "label": "miete"}) + "\n")
    ok(home, "suite", "add", "tickets", "--kind", "classification", "--path", str(tickets))
    assert "has no eval runs yet" in ok(home, "eval", "leaderboard", "tickets-task")
