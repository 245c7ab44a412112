"""The production loop through one `taskfleet up` (real nats-server, two sidecars, runtimes):
a classification task and a rerank task, each with a served champion and a shadow, every
request sampled, feedback for each. The shadows' copies run on the other worker and never reach
the caller; the agreement the registry reports equals what the replies say (same label; the
share of the champion's top 3 documents in the shadow's top 3); the feedback becomes a live
version of each suite, on which the control plane re-evaluates champion and shadow by itself,
each on exactly the live items, with the macro-F1 / nDCG@10 of an offline eval of those items;
bad feedback is one documented 4xx each and nothing is recorded twice. The suites are small
fixtures so that `make test` stays cheap; the 1,000-item replays of the german-legal tasks and
the shadow's cost under load are not measured yet (docs/architecture.md "Not yet")."""

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

from evals import agreement
from evals.beir import doc_text, read_jsonl
from evals.classifiers import ModelClassifier
from evals.harness import evaluate
from evals.rerankers import CrossEncoderReranker
from evals.runner import EvalPaths, run_eval
from evals.suites import SuiteSpec, declare
from registry import Registry
from registry.entities import EvalRun, TrainingRecord
from serving.client import Client
from serving.runtime.model_folder import ModelSpec
from testbed.fleet import free_port, wait_until
from testbed.tiny_model import build_tiny_head, build_tiny_model
from tests.kinds_fixture import LABELS, build_classification, build_rerank

REPO = Path(__file__).resolve().parent.parent
TASK = "area"
ITEMS = 12
RERANK = "rank"
QUERIES = 8


def _seed(home: Path, tmp: Path) -> tuple[dict[str, Path], dict[str, Path], dict[str, str]]:
    base = build_tiny_model(tmp / "base", seed=31)
    heads = {
        "a": build_tiny_head(base, tmp / "a", seed=32),
        "b": build_tiny_head(base, tmp / "b", seed=33, lora=False),
        "ra": build_tiny_head(base, tmp / "ra", kind="score", seed=34),
        "rb": build_tiny_head(base, tmp / "rb", kind="score", seed=35, lora=False),
    }
    folders = {
        TASK: build_classification(tmp / "area", splits={"test": ITEMS, "train": 9}),
        RERANK: build_rerank(tmp / "rank", queries={"test": QUERIES, "train": 6}),
    }
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    reg.add_model("tiny", path=base)
    paths = EvalPaths(cache_dir=home / "cache")
    tasks = {
        TASK: ("classification", "classifier", ("a", "b"), ITEMS),
        RERANK: ("rerank", "cross-encoder", ("ra", "rb"), QUERIES),
    }
    for task, (kind, candidate_kind, (champion, shadow), items) in tasks.items():
        reg.add_suite(declare(f"{task}-suite", kind, folders[task])[0])
        reg.add_task(task, suite=f"{task}-suite")
        for name in (champion, shadow):
            record = TrainingRecord("0" * 64, "train", {}, 0, "test", suite=f"{task}-suite")
            reg.register_adapter(
                f"tiny-{name}", base="tiny", source_dir=heads[name], training=record
            )
            reg.add_candidate(task, name=name, adapter=f"tiny-{name}", kind=candidate_kind)
            run_eval(reg, task, name, paths)
        reg.promote(task, champion, reason="first champion")
        # Every labelled item of the replay makes one live version; no drift window fills.
        reg.set_production_settings(task, live_every=items, drift_window=10_000)
        reg.start_shadow(task, shadow, sample_rate=1.0, reason=f"compare {shadow} on live traffic")
    reg.add_task("other", suite=f"{TASK}-suite")
    keys = {
        "app": reg.create_api_key("app", roles=["caller"], tasks=[TASK, RERANK])[1],
        "other": reg.create_api_key("elsewhere", roles=["caller"], tasks=["other"])[1],
    }
    reg.close()
    return {"base": base, **heads}, folders, keys


def _rows(folder: Path) -> list[dict[str, str]]:
    lines = (folder / "test.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _rerank_rows(folder: Path) -> list[tuple[str, list[str], list[int]]]:
    """The test split's (query, documents in the order judged, indexes of the relevant ones),
    the documents' texts as the eval harness reads them."""
    corpus = {str(row["_id"]): doc_text(row) for _, row in read_jsonl(folder / "corpus.jsonl")}
    queries = {str(row["_id"]): str(row["text"]) for _, row in read_jsonl(folder / "queries.jsonl")}
    relevant: dict[str, set[str]] = {}
    for line in (folder / "qrels" / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        qid, doc, _ = line.split("\t")
        relevant.setdefault(qid, set()).add(doc)
    out = []
    for line in (folder / "top_ranked" / "test.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        ids = [str(d) for d in row["corpus-ids"]]
        hits = [k for k, d in enumerate(ids) if d in relevant[str(row["query-id"])]]
        out.append((queries[str(row["query-id"])], [corpus[d] for d in ids], hits))
    return out


@pytest.mark.slow  # a whole fleet: two sidecars with their runtimes, re-evaluation subprocesses
def test_shadow_feedback_live_split_and_reevaluation_through_taskfleet_up(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    models, folders, keys = _seed(home, tmp_path)
    port, control_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "TASKFLEET_NATS_URL"}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    log = (tmp_path / "up.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "taskfleet", "--home", str(home), "up", "--workers", "2",
         "--port", str(port), "--control-port", str(control_port)],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    try:
        gateway = f"http://127.0.0.1:{port}"
        wait_until(lambda: (home / "run" / "stack.json").is_file(), timeout_s=60)

        def shadows_serving() -> bool:
            workers = reg.list_workers(reachable_only=True)
            for task in (TASK, RERANK):
                holders = {w.worker_id for w in workers if f"{task}.shadow" in w.epochs}
                champions = {w.worker_id for w in workers if task in w.epochs}
                # The shadow runs beside the champion, on the other worker.
                if not holders or not champions or holders & champions:
                    return False
            return True

        wait_until(shadows_serving, timeout_s=90, every_s=0.5)

        rows = _rows(folders[TASK])
        ranked = _rerank_rows(folders[RERANK])
        champion_labels: list[str] = []
        champion_scores: list[np.ndarray] = []
        with Client(gateway, keys["app"], max_retries=30) as client:
            for row in rows:
                reply = client.classify(TASK, [row["text"]])
                assert reply.sampled and reply.request_id is not None
                champion_labels += reply.predictions()
                client.feedback(reply.request_id, label=row["label"])
            last = reply.request_id
            for query, documents, relevant in ranked:
                scored = client.rerank(RERANK, query, documents)
                assert scored.sampled and scored.request_id is not None
                champion_scores.append(scored.scores)
                client.feedback(scored.request_id, relevant=relevant)
            last_ranked = scored.request_id

        # Bad feedback: one documented 4xx each, in the one error shape.
        def feedback(body: dict[str, object], key: str = keys["app"]) -> httpx.Response:
            return httpx.post(
                f"{gateway}/v1/feedback", json=body, headers={"Authorization": f"Bearer {key}"}
            )

        mine, theirs, label = keys["app"], keys["other"], LABELS[0]
        refusals: dict[str, tuple[dict[str, object], str, int, str]] = {
            "again": ({"request_id": last, "label": label}, mine, 409, "FEEDBACK_EXISTS"),
            "unknown": ({"request_id": "f" * 32, "label": label}, mine, 404, "UNKNOWN_REQUEST"),
            "label": ({"request_id": last, "label": "zoll"}, mine, 400, "BAD_REQUEST"),
            "index": ({"request_id": last, "label": label, "index": 1}, mine, 400, "BAD_REQUEST"),
            "scope": ({"request_id": last, "label": label}, theirs, 403, "FORBIDDEN"),
            "shape": ({"request_id": last}, mine, 400, "BAD_REQUEST"),
            "document": ({"request_id": last_ranked, "relevant": [99]}, mine, 400, "BAD_REQUEST"),
            "kind": ({"request_id": last_ranked, "label": label}, mine, 400, "BAD_REQUEST"),
        }
        for what, (body, key, status, code) in refusals.items():
            r = feedback(body, key)
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), (what, r.text)

        # The control plane keeps every sample with the shadow's side, and the agreement it
        # reports is the share of inputs on which both models gave the caller the same answer.
        def judged(task: str, inputs: int) -> object:
            summary = reg.agreement_summary(task)
            return summary if summary.outcomes.get("ok") == inputs else None

        summary = wait_until(lambda: judged(TASK, ITEMS), timeout_s=60, every_s=0.5)
        shadow = ModelClassifier(ModelSpec(models["base"], models["b"])).classifier()
        texts = [row["text"] for row in rows]
        shadow_labels = [shadow.labels[i] for i in np.argmax(shadow.predict_proba(texts), axis=1)]
        same = np.mean([a == b for a, b in zip(champion_labels, shadow_labels, strict=True)])
        assert summary.estimate == pytest.approx(float(same), abs=1e-12)  # type: ignore[attr-defined]
        assert summary.shadow == "b" and summary.inputs == ITEMS  # type: ignore[attr-defined]

        summary = wait_until(lambda: judged(RERANK, QUERIES), timeout_s=60, every_s=0.5)
        scorer = CrossEncoderReranker(ModelSpec(models["base"], models["rb"])).scorer()
        theirs_scores = scorer.score([(query, documents) for query, documents, _ in ranked])
        top = agreement.RERANK_TOP
        overlap = [
            len(set(np.argsort(-a)[:top]) & set(np.argsort(-np.asarray(b))[:top])) / top
            for a, b in zip(champion_scores, theirs_scores, strict=True)
        ]
        assert summary.estimate == pytest.approx(float(np.mean(overlap)), abs=1e-12)  # type: ignore[attr-defined]
        assert summary.shadow == "rb" and summary.inputs == QUERIES  # type: ignore[attr-defined]

        # The feedback became a live version of each suite; champion and shadow were
        # re-evaluated on it by the control plane (live splits first, one at a time).
        def live_runs(task: str, pair: tuple[str, str]) -> dict[str, EvalRun] | None:
            suite = reg.get_suite(f"{task}-suite")
            if suite.live_split is None:
                return None
            runs = {
                r.candidate: r
                for r in reg.list_eval_runs(task)
                if r.suite_fingerprint == suite.fingerprint and r.split == "live"
            }
            return runs if set(runs) == set(pair) else None

        offline = SuiteSpec(
            name="offline", kind="classification", location=_only(rows, tmp_path / "offline"),
            test_split="test",
        )  # fmt: skip
        # The rerank replay is the whole test split, so the suite's own test split is exactly
        # the live items.
        offline_rank = SuiteSpec(
            name="offline-rank", kind="rerank", location=folders[RERANK], test_split="test"
        )
        checks: dict[str, tuple[tuple[str, str], int, SuiteSpec, str]] = {
            TASK: (("a", "b"), ITEMS, offline, "macro_f1"),
            RERANK: (("ra", "rb"), QUERIES, offline_rank, "ndcg_at_10"),
        }
        for task, (pair, items, spec, metric) in checks.items():
            runs = wait_until(lambda: live_runs(task, pair), timeout_s=300, every_s=1.0)  # noqa: B023
            assert reg.live_counts(task) == (items, 0)  # recorded once each, all in the version
            live = reg.get_suite(f"{task}-suite")
            counted = "items" if task == TASK else "queries"
            assert live.version == 2 and live.stats["live"][counted] == items
            for name in pair:
                run = runs[name]
                assert len(run.per_query) == items
                assert set(run.per_query) == set(runs[pair[0]].per_query)
                model = ModelSpec(models["base"], models[name])
                alone = evaluate(
                    spec,
                    "test",
                    ModelClassifier(model) if task == TASK else CrossEncoderReranker(model),
                )
                assert run.metrics[metric] == pytest.approx(alone.metrics[metric], abs=1e-9), (
                    task,
                    name,
                )
            # Champion and shadow, each queued on the new version's live and test splits.
            assert sorted((r.candidate, r.split) for r in reg.list_reevaluations(task)) == [
                (pair[0], "live"), (pair[0], "test"), (pair[1], "live"), (pair[1], "test"),
            ]  # fmt: skip
    finally:
        reg.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        with contextlib.suppress(Exception):
            print((tmp_path / "up.log").read_text()[-6000:])


def _only(rows: list[dict[str, str]], root: Path) -> Path:
    """A suite folder whose test split is exactly the replayed items."""
    root.mkdir(parents=True)
    labels = [{"label": label, "description": label} for label in LABELS]
    (root / "labels.json").write_text(json.dumps(labels), encoding="utf-8")
    with (root / "test.jsonl").open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return root
