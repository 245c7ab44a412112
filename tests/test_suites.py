"""Suites are registry records: versions by content, tasks bound to them, and runs of two
versions never compared (leaderboard, promotion rule, dashboard), over REST and the CLI too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from evals.suites import declare
from registry import InvalidInput, NotFound, Registry
from registry.api import create_app
from registry.entities import EvalRunCreate
from taskfleet.suite_registration import rest_suite_reader
from testbed.declared_tasks import declare_suite, fake_fingerprint
from tests.beir_fixture import build_beir
from tests.evalrun_fixture import QUERIES, record_run
from tests.test_registry import make_model_dir


def test_versions_by_content_and_tasks_bound_by_name(registry: Registry) -> None:
    v1 = declare_suite(registry, "tickets", kind="classification")
    again = declare_suite(registry, "tickets", kind="classification")
    assert (v1.version, again.id) == (1, v1.id)  # same content: the same version
    v2 = declare_suite(
        registry, "tickets", kind="classification", fingerprint=fake_fingerprint("tickets", 2)
    )
    assert v2.version == 2 and registry.get_suite("tickets") == v2
    assert registry.get_suite("tickets", 1) == v1
    assert [s.version for s in registry.suite_versions("tickets")] == [2, 1]
    with pytest.raises(InvalidInput, match="cannot change its kind"):
        declare_suite(registry, "tickets", kind="rerank", fingerprint=fake_fingerprint("x"))
    with pytest.raises(NotFound, match="unknown suite 'nope'"):
        registry.add_task("t", suite="nope")
    with pytest.raises(InvalidInput, match="is a classification suite"):
        registry.add_task("t", suite="tickets", kind="retrieval")
    task = registry.add_task("t", suite="tickets")
    assert task.kind == "classification"
    with pytest.raises(InvalidInput, match="does not fit task 't'; a classification task takes"):
        registry.add_candidate("t", kind="bm25")
    assert registry.add_candidate("t", kind="tfidf-lr").name == "tfidf-lr"
    assert [s.name for s in registry.list_suites()] == ["tickets"]


def _seed(registry: Registry, tmp_path: Path) -> None:
    declare_suite(registry, "legal-suite")
    registry.add_task("legal", suite="legal-suite")
    for name in ("a", "b"):
        registry.add_model(name, path=make_model_dir(tmp_path / name, name.encode()))
        registry.add_candidate("legal", base=name)


def test_runs_of_another_version_never_rank_or_promote(registry: Registry, tmp_path: Path) -> None:
    _seed(registry, tmp_path)
    record_run(registry, "legal", "a", 0.30, noise=0.05)
    record_run(registry, "legal", "b", 0.50, noise=0.05)
    registry.promote("legal", "a", reason="first")
    assert set(registry.leaderboard("legal")) == {"a", "b"}
    assert registry.check_promotion("legal", "b").passes

    # The folder changed: version 2. Nothing scored on version 1 ranks or promotes any more.
    declare_suite(registry, "legal-suite", fingerprint=fake_fingerprint("legal-suite", 2))
    assert registry.leaderboard("legal") == {}
    check = registry.check_promotion("legal", "b")
    assert not check.passes and "on the test split of suite legal-suite@2" in check.reason
    record_run(registry, "legal", "b", 0.50, noise=0.05)  # b on version 2
    check = registry.check_promotion("legal", "b")
    assert (
        not check.passes
        and "champion 'a' has no eval run through torch on suite legal-suite@2" in check.reason
    )
    record_run(registry, "legal", "a", 0.30, noise=0.05)
    assert registry.check_promotion("legal", "b").passes
    board = registry.leaderboard("legal")
    assert {r.suite_version for r in board.values()} == {"2"}


def test_a_run_must_name_a_registered_version_of_the_tasks_suite(
    registry: Registry, tmp_path: Path
) -> None:
    _seed(registry, tmp_path)
    declare_suite(registry, "other-suite")

    def run(suite: str, fingerprint: str) -> EvalRunCreate:
        return EvalRunCreate(
            task="legal",
            candidate="a",
            suite_name=suite,
            suite_version="1",
            suite_fingerprint=fingerprint,
            split="eval",
            main_metric="ndcg_at_10",
            metrics={"ndcg_at_10": 0.4},
            ci={},
            cost={},
            per_query={q: 0.4 for q in QUERIES},
        )

    with pytest.raises(InvalidInput, match="no registered version with fingerprint"):
        registry.record_eval_run(run("legal-suite", "e" * 64))
    with pytest.raises(InvalidInput, match="scored on suite 'legal-suite', not 'other-suite'"):
        registry.record_eval_run(run("other-suite", fake_fingerprint("other-suite")))
    assert registry.list_eval_runs("legal") == []


def test_rest_declares_reads_and_refuses_bad_folders(registry: Registry, tmp_path: Path) -> None:
    folder = build_beir(tmp_path / "beir", queries={"test": 6, "train": 4})
    app = create_app(
        registry,
        require_auth=False,
        read_suite=rest_suite_reader(data_root=None, mteb_dir=tmp_path / "mteb"),
    )
    client = TestClient(app)
    body = {"name": "faq", "kind": "retrieval", "path": str(folder)}
    r = client.post("/api/v1/suites", json=body)
    assert r.status_code == 201, r.text
    assert (r.json()["version"], r.json()["train_split"], r.json()["created"]) == (1, "train", True)
    assert r.json()["stats"]["test"] == {"queries": 6, "documents": 36}
    r = client.post("/api/v1/suites", json=body)
    assert r.status_code == 200 and r.json()["created"] is False
    r = client.post("/api/v1/suites", json={**body, "test_split": "nope"})
    assert r.status_code == 400 and "has no retrieval split 'nope'" in r.json()["error"]["message"]
    r = client.get("/api/v1/suites/faq")
    assert r.json()["versions"] == [1]
    assert [s["name"] for s in client.get("/api/v1/suites").json()] == ["faq"]
    r = client.get("/api/v1/suites/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND"
    no_reader = TestClient(create_app(registry, require_auth=False))
    r = no_reader.post("/api/v1/suites", json=body)
    assert r.status_code == 501 and r.json()["error"]["code"] == "NOT_IMPLEMENTED"


def test_dashboard_lists_suites_and_versions(registry: Registry, tmp_path: Path) -> None:
    folder = build_beir(tmp_path / "beir", queries={"eval": 6, "dev": 4})
    create, _ = declare("faq", "retrieval", folder, test_split="eval", description="<b>FAQ</b>")
    registry.add_suite(create)
    registry.add_task("faq-search", suite="faq")
    client = TestClient(create_app(registry, require_auth=False))
    page = client.get("/suites").text
    assert 'data-suite="faq"' in page and "faq-search" in page
    assert "&lt;b&gt;FAQ&lt;/b&gt;" in page and "<b>FAQ</b>" not in page  # escaped
    page = client.get("/suites/faq").text
    assert create.fingerprint[:16] in page and 'data-version="1"' in page
    task = client.get("/tasks/faq-search").text
    assert "version 1" in task and create.fingerprint[:12] in task
    assert client.get("/suites/nope").status_code == 404


# ---- the bug this issue fixes: another folder scored under a registered suite's name --------
def _cli(home: Path, data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TASKFLEET_HOME": str(home), "TASKFLEET_DATA_DIR": str(data)}
    env.update(COLUMNS="200", HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "taskfleet", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # CLI subprocesses
def test_suite_path_with_other_data_never_ranks_under_the_builtin_name(tmp_path: Path) -> None:
    """`eval run --suite-path OTHER` used to score another folder under the built-in suite's
    name and the leaderboard ranked it with the rest. Now the run is refused (the data is not
    the registered version) with one line, and nothing is recorded."""
    home, data = tmp_path / "home", tmp_path / "data"
    build_beir(data / "gerlayqa" / "beir", queries={"eval": 10, "dev": 6})
    other = build_beir(tmp_path / "other", queries={"eval": 10, "dev": 6}, seed=99)
    task = "german-legal-retrieval"
    for args in (("task", "add", task), ("candidate", "add", task, "--kind", "bm25")):
        r = _cli(home, data, *args)
        assert r.returncode == 0, r.stderr
    assert _cli(home, data, "eval", "run", task, "-c", "bm25", "--no-mlflow").returncode == 0
    r = _cli(home, data, "eval", "run", task, "-c", "bm25", "--suite-path", str(other))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "is not version 1 of suite 'german-legal-retrieval'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    board = _cli(home, data, "eval", "leaderboard", task).stdout
    assert board.count("bm25") == 1
    # The same data moved elsewhere is the same version: allowed.
    moved = build_beir(tmp_path / "moved", queries={"eval": 10, "dev": 6})
    r = _cli(home, data, "eval", "run", task, "-c", "bm25", "--suite-path", str(moved))
    assert r.returncode == 0, r.stderr


def test_dashboard_shows_each_kinds_metrics_and_the_confusion_matrix(
    registry: Registry, tmp_path: Path
) -> None:
    declare_suite(registry, "area-suite", kind="classification", test_split="test")
    registry.add_task("area", suite="area-suite")
    registry.add_candidate("area", kind="tfidf-lr")
    suite = registry.get_suite("area-suite")
    gold = {"i1": "miete", "i2": "erbe", "i3": "erbe"}
    pred = {"i1": "miete", "i2": "erbe", "i3": "miete"}
    registry.record_eval_run(
        EvalRunCreate(
            task="area",
            candidate="tfidf-lr",
            suite_name=suite.name,
            suite_version="1",
            suite_fingerprint=suite.fingerprint,
            split="test",
            main_metric="macro_f1",
            metrics={"macro_f1": 0.6667, "accuracy": 0.6667},
            ci={"macro_f1": (0.3, 1.0), "accuracy": (0.3, 1.0)},
            cost={},
            per_query={i: float(gold[i] == pred[i]) for i in gold},
            details={
                "labels": ["miete", "erbe"],
                "per_class_f1": {"miete": 0.6667, "erbe": 0.6667},
                "support": {"miete": 1, "erbe": 2},
                "confusion_matrix": [[1, 0], [1, 1]],
                "gold": gold,
                "pred": pred,
            },
        )
    )
    client = TestClient(create_app(registry, require_auth=False))
    task = client.get("/tasks/area").text
    assert "macro_f1" in task and "accuracy 0.6667" in task
    assert "Promote" not in task  # a baseline cannot be placed
    page = client.get("/tasks/area/candidates/tfidf-lr").text
    assert 'class="grid confusion"' in page and "gold \\ predicted" in page
