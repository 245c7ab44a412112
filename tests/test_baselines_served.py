"""A winning lexical baseline is served like any model: fitted at `candidate add`, evaluated,
promoted, placed by sha256 and called by name through `taskfleet up`, with the labels,
probabilities and scores the eval's own code computes (german-legal-area's full test split)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from evals.classification_data import load_split
from evals.rerank_data import load_split as load_rerank_split
from evals.runner import EvalPaths, run_eval
from registry import Registry
from serving.client import Client
from serving.runtime.baseline_artifact import load_baseline
from serving.runtime.lexical import Bm25, TfidfLogReg
from taskfleet.baseline_builder import fit_baseline
from taskfleet.suite_registration import ensure_suite
from testbed.fleet import COLD_START_S, free_port, wait_until
from testbed.gerlayqa import SHARED_DATA

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("TASKFLEET_DATA_DIR") or SHARED_DATA)
AREA, RERANK = "german-legal-area", "german-legal-rerank"


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TASKFLEET_NATS_URL"}
    env.update(TASKFLEET_HOME=str(home), TASKFLEET_DATA_DIR=str(DATA), PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "taskfleet", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def ok(home: Path, *args: str) -> str:
    done = cli(home, *args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CLI fits the area baseline (its wiring is what a user meets); the rest goes through
    the same registry and runner in-process, to spare CLI start-ups on a shared machine."""
    home = tmp_path_factory.mktemp("served") / "home"
    ok(home, "task", "add", AREA)
    added = ok(home, "candidate", "add", AREA, "--kind", "tfidf-lr")
    assert f"model {AREA}-tfidf-lr: tfidf-lr fitted on suite {AREA}" in " ".join(added.split())
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    try:
        paths = EvalPaths(cache_dir=home / "cache", data_root=DATA)
        run = run_eval(reg, AREA, "tfidf-lr", paths)
        assert run.sample_size is None and run.cost["cpu_ms_per_item"] > 0
        reg.promote(AREA, "tfidf-lr", reason="the best on its leaderboard")
        ensure_suite(reg, RERANK, data_root=DATA, mteb_dir=home / "suites")
        reg.add_task(RERANK, suite=RERANK)
        fit = functools.partial(fit_baseline, data_root=DATA)
        reg.add_candidate(RERANK, kind="bm25", fit_baseline=fit)
        run_eval(reg, RERANK, "bm25", paths, sample=50)
        reg.promote(RERANK, "bm25", reason="first champion")
    finally:
        reg.close()
    return home


@pytest.fixture(scope="module")
def gateway(home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port, control_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "TASKFLEET_NATS_URL"}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO), TASKFLEET_DATA_DIR=str(DATA))
    log_path = tmp_path_factory.mktemp("up") / "up.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "taskfleet", "--home", str(home), "up", "--workers", "1",
             "--no-auth", "--port", str(port), "--control-port", str(control_port)],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_until(lambda: (home / "run" / "stack.json").is_file(), timeout_s=COLD_START_S)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def placed(home: Path, model: str) -> Path:
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    try:
        return reg.model_path(model)
    finally:
        reg.close()


@pytest.mark.slow  # fits on the full training split and serves through a whole fleet
def test_tfidf_lr_is_served_by_name_as_the_eval_scored_it(home: Path, gateway: str) -> None:
    model = load_baseline(placed(home, f"{AREA}-tfidf-lr"))
    assert isinstance(model, TfidfLogReg)
    test = load_split(DATA / "gerlayqa-area", "test")
    expected = model.predict_proba(test.texts)
    served_rows: list[list[dict[str, float | str]]] = []
    with httpx.Client(timeout=120) as http:
        for start in range(0, len(test.texts), 1100):  # the gateway takes 2048 inputs a call
            chunk = test.texts[start : start + 1100]
            answer = wait_until(
                lambda chunk=chunk: _classify(http, gateway, chunk), timeout_s=180, every_s=2
            )
            served_rows += answer
    assert len(served_rows) == len(test.texts) == 2152
    for row, probabilities in zip(served_rows, expected, strict=True):
        by_label = {str(item["label"]): float(item["score"]) for item in row}
        np.testing.assert_allclose(
            [by_label[label] for label in model.labels], probabilities, atol=1e-6
        )
        best = max(row, key=lambda item: float(item["score"]))["label"]
        assert best == model.labels[int(np.argmax(probabilities))]
    # The task endpoint, msgpack by default, says which model answered.
    with Client(gateway, max_retries=30) as client:
        labelled = client.classify(AREA, test.texts[:64])
    assert labelled.labels == list(model.labels)
    np.testing.assert_allclose(labelled.probabilities, expected[:64], atol=1e-6)
    assert labelled.model_key.startswith(f"{AREA}-tfidf-lr-")


def _classify(
    http: httpx.Client, gateway: str, texts: list[str]
) -> list[list[dict[str, float | str]]] | None:
    response = http.post(f"{gateway}/v1/classify", json={"model": AREA, "input": texts})
    if response.status_code == 503:  # the worker is still fetching and loading it
        return None
    assert response.status_code == 200, response.text
    rows: list[list[dict[str, float | str]]] = response.json()["data"]
    return rows


@pytest.mark.slow
def test_bm25_is_served_by_name_with_the_eval_s_scores(home: Path, gateway: str) -> None:
    ranker = load_baseline(placed(home, f"{RERANK}-bm25"))
    assert isinstance(ranker, Bm25)
    data = load_rerank_split(DATA / "gerlayqa-rerank", "test")
    with Client(gateway, max_retries=60) as client:
        for qid in list(data.candidates)[:120]:
            documents = [data.corpus[d] for d in data.candidates[qid]]
            served = client.rerank(RERANK, data.queries[qid], documents).scores
            expected = ranker.score(data.queries[qid], documents)
            assert np.all(np.abs(served - expected) <= 1e-6 * np.maximum(1.0, np.abs(expected)))


def test_what_stays_unservable_says_so_in_one_line(home: Path) -> None:
    ok(home, "task", "add", "german-legal-retrieval")
    ok(home, "candidate", "add", "german-legal-retrieval", "--kind", "bm25")
    done = cli(home, "promote", "german-legal-retrieval", "bm25", "--override", "--reason", "x")
    assert done.returncode == 1
    assert "BM25 for retrieval makes no embedding" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    # A fitted artifact takes no adapter, no variant and no other candidate kind.
    done = cli(home, "candidate", "add", AREA, "--base", f"{AREA}-tfidf-lr", "--kind", "classifier")
    assert done.returncode == 1 and "fitted tfidf-lr baseline" in done.stderr
    done = cli(home, "candidate", "add", AREA, "--kind", "tfidf-lr")
    assert done.returncode == 1 and "already has a candidate named 'tfidf-lr'" in done.stderr
