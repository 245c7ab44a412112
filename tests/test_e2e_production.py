"""The production loop through one `taskfleet up` (real nats-server, two sidecars, runtimes):
a classification task and a rerank task, each with a served champion and a shadow, every
request sampled, feedback for each. The shadows' copies run on the other worker and never reach
the caller; the agreement the registry reports equals what the replies say (same label; the
share of the champion's top 3 documents in the shadow's top 3); the feedback becomes a live
version of each suite, on which the control plane re-evaluates champion and shadow by itself,
each on exactly the live items, with the macro-F1 / nDCG@10 of an offline eval of those items;
bad feedback is one documented 4xx each and nothing is recorded twice. The suites are small
fixtures so that `make test` stays cheap; benchmarks/production.py drives the same steps
(testbed/production.py) on 1,000 items of the german-legal tasks and measures the shadow's
cost under load."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from evals import agreement
from evals.runner import EvalPaths, run_eval
from evals.suites import declare
from registry import Registry
from registry.entities import AgreementSummary, TrainingRecord
from serving.client import Client
from testbed.fleet import COLD_START_S, HTTP_TIMEOUT_S, wait_until
from testbed.production import (
    UpStack,
    classification_folder,
    judged,
    label_agreement,
    labelled_texts,
    live_runs,
    offline_eval,
    ranked_queries,
    replay_classification,
    replay_rerank,
    shadows_serving,
    taskfleet_up,
    top_overlap,
)
from testbed.tiny_model import build_tiny_head, build_tiny_model
from tests.kinds_fixture import LABELS, build_classification, build_rerank

TASK = "area"
ITEMS = 12
RERANK = "rank"
QUERIES = 8


def _seed(home: Path, tmp: Path) -> tuple[dict[str, Path], dict[str, str]]:
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
    return folders, keys


@pytest.mark.slow  # a whole fleet: two sidecars with their runtimes, re-evaluation subprocesses
# Each re-evaluation is a `taskfleet eval run` subprocess, ~20 CPU-s of it imports (torch,
# transformers, sentence-transformers, sklearn): the live runs waited 150 and 170 s here in a
# make test on a slow day (TASKFLEET_WAIT_LOG), and the test took 513 s of pytest's 600 s.
@pytest.mark.timeout(1200)
def test_shadow_feedback_live_split_and_reevaluation_through_taskfleet_up(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    folders, keys = _seed(home, tmp_path)
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    stack: UpStack | None = None
    try:
        with taskfleet_up(home, tmp_path / "up.log", "--workers", "2") as stack:
            gateway = stack.gateway
            # The shadow runs beside the champion, on the other worker.
            wait_until(
                lambda: shadows_serving(reg, (TASK, RERANK)), timeout_s=COLD_START_S, every_s=0.5
            )

            rows = labelled_texts(folders[TASK])
            ranked = ranked_queries(folders[RERANK])
            with Client(gateway, keys["app"], max_retries=30) as client:
                replay = replay_classification(client, TASK, rows)
                replay_ranked = replay_rerank(client, RERANK, ranked)
            last, last_ranked = replay.replies[-1].request_id, replay_ranked.replies[-1].request_id

            # Bad feedback: one documented 4xx each, in the one error shape.
            def feedback(body: dict[str, object], key: str = keys["app"]) -> httpx.Response:
                return httpx.post(
                    f"{gateway}/v1/feedback",
                    json=body,
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=HTTP_TIMEOUT_S,
                )

            mine, theirs, label, bad = keys["app"], keys["other"], LABELS[0], "BAD_REQUEST"
            refusals: dict[str, tuple[dict[str, object], str, int, str]] = {
                "again": ({"request_id": last, "label": label}, mine, 409, "FEEDBACK_EXISTS"),
                "unknown": ({"request_id": "f" * 32, "label": label}, mine, 404, "UNKNOWN_REQUEST"),
                "label": ({"request_id": last, "label": "zoll"}, mine, 400, bad),
                "index": ({"request_id": last, "label": label, "index": 1}, mine, 400, bad),
                "scope": ({"request_id": last, "label": label}, theirs, 403, "FORBIDDEN"),
                "shape": ({"request_id": last}, mine, 400, bad),
                "document": ({"request_id": last_ranked, "relevant": [99]}, mine, 400, bad),
                "kind": ({"request_id": last_ranked, "label": label}, mine, 400, bad),
            }  # fmt: skip
            for what, (body, key, status, code) in refusals.items():
                r = feedback(body, key)
                assert (r.status_code, r.json()["error"]["code"]) == (status, code), (what, r.text)

            # The shadows' answers in-process, on exactly the replayed items (the offline evals
            # the live runs are compared with below).
            replayed = classification_folder(rows, folders[TASK], tmp_path / "items")
            offline = {
                (TASK, name): offline_eval(reg, TASK, name, replayed, home / "cache")
                for name in ("a", "b")
            }
            # The rerank replay is the whole test split: the suite folder is exactly the items.
            offline |= {
                (RERANK, name): offline_eval(reg, RERANK, name, folders[RERANK], home / "cache")
                for name in ("ra", "rb")
            }

            # The control plane keeps every sample with the shadow's side, and the agreement it
            # reports is the share of inputs on which both models gave the caller the same answer.
            def all_answered(task: str, shadow: str, inputs: int) -> AgreementSummary | None:
                summary = judged(reg, task, shadow, inputs)
                return (
                    summary
                    if summary is not None and summary.outcomes.get("ok") == inputs
                    else None
                )

            summary = wait_until(lambda: all_answered(TASK, "b", ITEMS), timeout_s=60, every_s=0.5)
            served = [label for reply in replay.replies for label in reply.predictions()]
            same = label_agreement(served, offline[(TASK, "b")].labels())
            assert summary.estimate == pytest.approx(same, abs=1e-12)
            assert summary.shadow == "b" and summary.inputs == ITEMS

            summary = wait_until(
                lambda: all_answered(RERANK, "rb", QUERIES), timeout_s=60, every_s=0.5
            )
            overlap = [
                top_overlap(
                    reply.scores, offline[(RERANK, "rb")].scores(query), agreement.RERANK_TOP
                )
                for reply, query in zip(replay_ranked.replies, ranked, strict=True)
            ]
            assert summary.estimate == pytest.approx(float(np.mean(overlap)), abs=1e-12)
            assert summary.shadow == "rb" and summary.inputs == QUERIES

            # The feedback became a live version of each suite; champion and shadow were
            # re-evaluated on it by the control plane (live splits first, one at a time).
            checks: dict[str, tuple[tuple[str, str], int, str]] = {
                TASK: (("a", "b"), ITEMS, "macro_f1"),
                RERANK: (("ra", "rb"), QUERIES, "ndcg_at_10"),
            }
            for task, (pair, items, metric) in checks.items():
                runs = wait_until(lambda: live_runs(reg, task, pair), timeout_s=600, every_s=1.0)  # noqa: B023
                assert reg.live_counts(task) == (items, 0)  # recorded once each, all in the version
                live = reg.get_suite(f"{task}-suite")
                counted = "items" if task == TASK else "queries"
                assert live.version == 2 and live.stats["live"][counted] == items
                for name in pair:
                    run = runs[name]
                    assert len(run.per_query) == items
                    assert set(run.per_query) == set(runs[pair[0]].per_query)
                    alone = offline[(task, name)].result
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
        if stack is not None:
            print(stack.log_tail())
