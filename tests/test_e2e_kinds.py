"""One `taskfleet up` serves three task kinds from one base: an embedding task, a rerank task
(cross-encoder) and a classification task, each promoted after a real eval of its suite.
Scores and probabilities through the fleet equal what the eval harness computes in-process;
the Cohere client (base_url) and raw HTTP answer on the stock-client endpoints."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from evals.classifiers import ModelClassifier
from evals.rerankers import CrossEncoderReranker
from evals.runner import EvalPaths, run_eval
from evals.suites import declare
from registry import Registry
from registry.entities import TrainingRecord
from serving.client import Client
from serving.runtime.model_folder import ModelSpec
from testbed.fleet import COLD_START_S, HTTP_TIMEOUT_S, free_port, wait_until
from testbed.tiny_model import build_tiny_adapter, build_tiny_head, build_tiny_model
from tests.beir_fixture import build_beir
from tests.kinds_fixture import build_classification, build_rerank

REPO = Path(__file__).resolve().parent.parent
QUERY = "der vermieter will die kaution nicht zurückzahlen"
DOCUMENTS = [
    "mieter vermieter wohnung kaution kündigung",
    "erbe erblasser testament pflichtteil",
    "käufer verkäufer kaufpreis mangel",
]
TEXTS = ["wer erbt das haus nach dem testament", "die miete ist zu hoch", "ein mangel am auto"]


def _record(name: str) -> TrainingRecord:
    return TrainingRecord("0" * 64, "train", {}, 0, "test", suite=name)


def _seed(home: Path, tmp: Path) -> dict[str, Path]:
    base = build_tiny_model(tmp / "base", seed=21)
    adapters = {
        "emb": build_tiny_adapter(base, tmp / "emb", seed=22),
        "ce": build_tiny_head(base, tmp / "ce", kind="score", seed=23),
        # Reads long texts as windows (8 tokens, one every 4 word pieces): the served
        # probabilities must follow the head's rule as the eval harness does.
        "cls": build_tiny_head(
            base,
            tmp / "cls",
            kind="classify",
            seed=24,
            max_seq_length=8,
            window_stride=4,
            max_windows=8,
        ),
    }
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    folders = {
        "retrieval": build_beir(tmp / "retrieval", queries={"test": 8, "train": 6}),
        "rerank": build_rerank(tmp / "rerank", queries={"test": 8, "train": 6}),
        "classification": build_classification(tmp / "area", splits={"test": 9, "train": 9}),
    }
    reg.add_model("tiny", path=base)
    kinds = {"retrieval": ("emb", "embedding"), "rerank": ("ce", "cross-encoder")}
    kinds["classification"] = ("cls", "classifier")
    paths = EvalPaths(cache_dir=home / "cache")
    for kind, folder in folders.items():
        reg.add_suite(declare(f"{kind}-suite", kind, folder)[0])
        reg.add_task(f"{kind}-task", suite=f"{kind}-suite")
        short, candidate_kind = kinds[kind]
        reg.register_adapter(
            f"tiny-{short}",
            base="tiny",
            source_dir=adapters[short],
            training=_record(f"{kind}-suite"),
        )
        candidate = reg.add_candidate(f"{kind}-task", adapter=f"tiny-{short}", kind=candidate_kind)
        run_eval(reg, f"{kind}-task", candidate.name, paths)
        reg.promote(f"{kind}-task", candidate.name, reason="first champion")
    reg.close()
    return {"base": base, **adapters}


@pytest.mark.slow  # a whole fleet with a real sidecar and runtime
def test_three_kinds_on_one_base_through_taskfleet_up(tmp_path: Path) -> None:
    home = tmp_path / "home"
    models = _seed(home, tmp_path)
    port, control_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "TASKFLEET_NATS_URL"}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    log = (tmp_path / "up.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "taskfleet", "--home", str(home), "up", "--workers", "1",
         "--no-auth", "--port", str(port), "--control-port", str(control_port)],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        gateway = f"http://127.0.0.1:{port}"
        wait_until(lambda: (home / "run" / "stack.json").is_file(), timeout_s=COLD_START_S)
        with Client(gateway, max_retries=60) as client:
            vectors = client.embed("retrieval-task", TEXTS)
            scores = client.rerank("rerank-task", QUERY, DOCUMENTS)
            labelled = client.classify("classification-task", TEXTS)

        # What the eval harness computes in-process, with the same model library.
        ce = CrossEncoderReranker(ModelSpec(models["base"], models["ce"])).scorer()
        np.testing.assert_allclose(scores.scores, ce.score([(QUERY, DOCUMENTS)])[0], atol=1e-5)
        classifier = ModelClassifier(ModelSpec(models["base"], models["cls"])).classifier()
        assert labelled.labels == list(classifier.labels) == ["miete", "kauf", "erbe"]
        np.testing.assert_allclose(
            labelled.probabilities, classifier.predict_proba(TEXTS), atol=1e-5
        )
        assert vectors.shape == (3, 32)
        assert scores.model_key != labelled.model_key and scores.epoch == labelled.epoch == 1

        # The Cohere client against /v1/rerank, `model` = the task.
        import cohere

        co = cohere.Client(api_key="unused", base_url=gateway)
        answer = co.rerank(
            model="rerank-task", query=QUERY, documents=DOCUMENTS, top_n=2, return_documents=True
        )
        best = np.argsort(-scores.scores, kind="stable")[:2]
        assert [r.index for r in answer.results] == best.tolist()
        np.testing.assert_allclose(
            [r.relevance_score for r in answer.results], scores.scores[best], atol=1e-5
        )
        assert answer.results[0].document.text == DOCUMENTS[best[0]]  # type: ignore[union-attr]

        # /v1/classify in the TEI/infinity shape, raw HTTP.
        r = httpx.post(
            f"{gateway}/v1/classify",
            json={"model": "classification-task", "input": TEXTS},
            timeout=HTTP_TIMEOUT_S,
        )
        assert r.status_code == 200, r.text
        rows = r.json()["data"]
        for row, probabilities in zip(rows, labelled.probabilities, strict=True):
            assert [x["score"] for x in row] == sorted((x["score"] for x in row), reverse=True)
            got = {x["label"]: x["score"] for x in row}
            np.testing.assert_allclose(
                [got[label] for label in labelled.labels], probabilities, atol=1e-6
            )
        # A body of the wrong kind, or the wrong endpoint for a task's kind: one clear 400.
        r = httpx.post(
            f"{gateway}/v1/tasks/rerank-task", json={"inputs": ["x"]}, timeout=HTTP_TIMEOUT_S
        )
        assert r.status_code == 400 and "unknown field(s) 'inputs'" in r.json()["error"]["message"]
        r = httpx.post(
            f"{gateway}/v1/embeddings",
            json={"model": "rerank-task", "input": "x"},
            timeout=HTTP_TIMEOUT_S,
        )
        assert r.status_code == 400 and "call POST /v1/rerank" in r.json()["error"]["message"]

        # `taskfleet call` for each kind, as a user checks a task by hand.
        def call(*args: str) -> str:
            done = subprocess.run(
                [sys.executable, "-m", "taskfleet", "call", *args, "--url", gateway],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            return done.stdout

        assert "3 scores, served by model" in call(
            "rerank-task", "--query", QUERY, *[a for d in DOCUMENTS for a in ("-t", d)]
        )
        assert "1 x 3 probabilities" in call("classification-task", "--classify", "-t", TEXTS[0])

        # One base serves the three tasks: loaded once, three adapters on it (as the fleet
        # watcher mirrors the worker's heartbeat into the registry).
        def fleet() -> dict[str, object] | None:
            out = subprocess.run(
                [sys.executable, "-m", "taskfleet", "--home", str(home), "placement", "ls",
                 "--json"],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
            ).stdout  # fmt: skip
            workers = json.loads(out)["workers"] if out else []
            return workers[0] if workers and len(workers[0]["loaded"]) == 3 else None

        worker = wait_until(fleet, timeout_s=60, every_s=1.0)
        base_bytes = sum(p.stat().st_size for p in models["base"].rglob("*.safetensors"))
        used = int(worker["memory_used"])  # type: ignore[call-overload]
        assert 0.5 * base_bytes < used < 1.5 * base_bytes, "the base must be loaded once"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        with contextlib.suppress(Exception):
            print((tmp_path / "up.log").read_text()[-4000:])
