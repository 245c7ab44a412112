"""The acceptance path of user-declared suites, through the CLI: a retrieval, a rerank and a
classification folder are registered, evaluated and ranked (the CLI app in-process, to spare
thirty interpreter starts); bad input, run as a user runs it (`python -m taskfleet`), gives one
clear line and records nothing. Broken files of every kind (encoding, nesting, sizes, labels
MLflow cannot log) are one line through REST and the CLI, and checked in linear time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from evals import classification_data
from evals.errors import SuiteDataError
from evals.tracking import key_problem, log_eval_run, per_class_metric
from registry import Registry
from registry.api import create_app
from taskfleet.suite_registration import rest_suite_reader
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
    state.reset()  # the next command opens its own
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
    state.reset()
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


# ---- issue 18: every way a folder can be wrong is one line, found in linear time -----------
def _rest(tmp_path: Path) -> tuple[TestClient, Registry]:
    reg = Registry.open(f"sqlite:///{tmp_path / 'r.db'}", artifact_dir=tmp_path / "a")
    reader = rest_suite_reader(data_root=None, mteb_dir=tmp_path / "mteb")
    return TestClient(create_app(reg, require_auth=False, read_suite=reader)), reg


def _broken_folders(tmp_path: Path) -> dict[str, tuple[str, Path, str]]:
    """name -> (kind, folder, what the one line must say); each folder breaks one file."""
    tickets = build_classification(tmp_path / "tickets", splits={"test": 6})
    faq = build_beir(tmp_path / "faq", queries={"test": 4})
    cases: dict[str, tuple[str, Path, str]] = {}

    def variant(name: str, source: Path, kind: str, says: str) -> Path:
        folder = shutil.copytree(source, tmp_path / name)
        cases[name] = (kind, folder, says)
        return folder

    labels = json.loads((tickets / "labels.json").read_text())
    latin = variant("latin1", tickets, "classification", "labels.json: not UTF-8 text")
    labels[0]["description"] = "Kündigung"
    (latin / "labels.json").write_bytes(json.dumps(labels, ensure_ascii=False).encode("latin-1"))
    deep = variant("deep", tickets, "classification", "labels.json: JSON nested too deeply")
    (deep / "labels.json").write_text("[" * 200_000 + "]" * 200_000)
    deep_row = variant("deep-row", tickets, "classification", "test.jsonl:7: JSON nested too")
    with (deep_row / "test.jsonl").open("a") as fh:
        fh.write('{"id": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    digits = variant("digits", tickets, "classification", "test.jsonl:7: a JSON value is too large")
    with (digits / "test.jsonl").open("a") as fh:
        fh.write('{"id": "x", "text": "t", "label": ' + "9" * 5000 + "}\n")
    for name, label, says in (
        ("angle", "a<b", "label 'a<b' cannot name its MLflow metric 'f1_a<b'"),
        ("bracket", "x[0]", "only letters, digits, spaces and the characters"),
        ("dots", "x/../y", "resolves to"),
        ("long", "l" * 300, "at most 250 characters"),
    ):
        folder = variant(f"label-{name}", tickets, "classification", says)
        (folder / "labels.json").write_text(json.dumps([*labels, {"label": label}]))
    described = variant("description", tickets, "classification", "'description' must be a str")
    (described / "labels.json").write_text(json.dumps([*labels, {"label": "z", "description": 1}]))
    qrels = faq / "qrels" / "test.tsv"
    for name, content, says in (
        ("qrels-latin1", "q1\td1\t1\nq\xe4\td1\t1\n".encode("latin-1"), "test.tsv: not UTF-8"),
        ("qrels-inf", b"q1\td1\tinf\n", "score 'inf' is not a finite number"),
        (
            "qrels-huge",
            b"q1\t" + b"d" * 200_000 + b"\t1\n",
            "unreadable line (field larger than field limit",
        ),
    ):
        folder = variant(name, faq, "retrieval", says)
        (folder / "qrels" / "test.tsv").write_bytes(qrels.read_bytes() + content)
    corpus = variant("corpus-latin1", faq, "retrieval", "corpus.jsonl: not UTF-8 text")
    with (corpus / "corpus.jsonl").open("ab") as fh:
        fh.write(json.dumps({"_id": "x", "text": "Kündigung"}, ensure_ascii=False).encode("cp1252"))
    return cases


def test_broken_suite_files_are_one_line_through_rest_and_cli(tmp_path: Path) -> None:
    cases = _broken_folders(tmp_path)
    client, reg = _rest(tmp_path)
    try:
        for name, (kind, folder, says) in cases.items():
            r = client.post(
                "/api/v1/suites", json={"name": name, "kind": kind, "path": str(folder)}
            )
            body = r.json()
            assert r.status_code == 400 and set(body) == {"error"}, (name, r.text[:300])
            message = body["error"]["message"]
            assert says in message and str(folder) in message, (name, message)
            assert "\n" not in message and len(message) < 700, (name, message)
        assert reg.list_suites() == []
    finally:
        reg.close()
    # The CLI, as a user runs it: one line, no traceback, nothing registered.
    home = tmp_path / "home"
    env = {**os.environ, "TASKFLEET_HOME": str(home), "COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
    picked = ("latin1", "deep", "label-angle", "qrels-inf")
    running = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "taskfleet",
                "--home",
                str(home / name),
                "suite",
                "add",
                name,
                "--kind",
                cases[name][0],
                "--path",
                str(cases[name][1]),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in picked
    }
    for name, process in running.items():
        _, stderr = process.communicate(timeout=300)
        lines = stderr.strip().splitlines()
        assert process.returncode == 1 and len(lines) == 1, (name, stderr[-2000:])
        assert cases[name][2] in lines[0] and "Traceback" not in stderr, (name, stderr)


def test_many_labels_are_checked_in_linear_time(tmp_path: Path) -> None:
    """20,000 labels took 11 s to check (a list searched per label and per row)."""
    folder = tmp_path / "wide"
    folder.mkdir()
    labels = [{"label": f"label-{i:05d}", "description": ""} for i in range(20_000)]
    (folder / "labels.json").write_text(json.dumps(labels))
    with (folder / "test.jsonl").open("w") as fh:
        for i in range(20_000):
            fh.write(json.dumps({"id": str(i), "text": "t", "label": f"label-{i:05d}"}) + "\n")
        fh.write(json.dumps({"id": "x", "text": "t", "label": "nope"}) + "\n")
    started = time.perf_counter()
    with pytest.raises(SuiteDataError) as refused:
        classification_data.load_split(folder, "test")
    took = time.perf_counter() - started
    message = str(refused.value)
    assert "unknown label 'nope'" in message and "(20000 labels)" in message and len(message) < 500
    assert took < 3.0, f"{took:.1f} s"
    (folder / "test.jsonl").write_text(
        "".join(
            json.dumps({"id": str(i), "text": "t", "label": "label-00001"}) + "\n" for i in range(3)
        )
    )
    data = classification_data.load_split(folder, "test")
    assert len(data.warnings) == 1 and "(19999 labels) never occur" in data.warnings[0]


@pytest.mark.parametrize(
    "label",
    ["miete", "Kündigung", "billing: refunds", "tech/support", "a.b", "x y", "a<b", "x[0]",
     "a|b", "$x$", "../etc", "a//b", "a/", "/a", ".", "a\n", "a&b", "x/../y", "l" * 247, "l" * 248],
)  # fmt: skip
def test_label_rule_is_mlflows(label: str) -> None:
    """A label is refused exactly when MLflow would refuse its metric name (or stricter)."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_length_limit, _validate_metric_name

    key = per_class_metric(label)
    try:
        _validate_metric_name(key)
        _validate_length_limit("Metric name", 250, key)
        mlflow_takes = True
    except MlflowException:
        mlflow_takes = False
    ours = key_problem(key) is None
    assert ours == mlflow_takes or (label == "a\n" and not ours), (label, ours, mlflow_takes)


def test_accepted_labels_are_logged_to_mlflow(tmp_path: Path) -> None:
    """What the reader accepts, MLflow records: per-class F1 of 1,003 labels, in two batches."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    labels = ["billing: refunds", "tech/support", "Kündigung", *(f"l{i}" for i in range(1000))]
    run_id = log_eval_run(
        uri,
        task="t",
        run_name="c",
        params={"task": "t", "suite": "s@1"},
        metrics={per_class_metric(label): 0.5 for label in labels},
        report_markdown="# r",
    )
    logged = mlflow.MlflowClient(tracking_uri=uri).get_run(run_id).data.metrics
    assert len(logged) == len(labels) and logged["f1_billing: refunds"] == 0.5
