"""The production loop through one `taskfleet up` (real nats-server, two sidecars, runtimes):
a classification task with a served champion and a shadow, every request sampled, feedback
for each. The shadow's copies run on the other worker and never reach the caller; the
agreement the registry reports equals what the replies say; the feedback becomes a live
version of the suite, on which the control plane re-evaluates champion and shadow by itself,
each on exactly the live items, with the macro-F1 of an offline eval of those items; bad
feedback is one documented 4xx each and nothing is recorded twice. (The 1,000-item replays,
rerank, drift and the shadow's cost are `make bench`: benchmarks/production.py.)"""

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
from evals.harness import evaluate
from evals.runner import EvalPaths, run_eval
from evals.suites import declare
from registry import Registry
from registry.entities import TrainingRecord
from serving.client import Client
from serving.runtime.encoder import ModelSpec
from testbed.fleet import free_port, wait_until
from testbed.tiny_model import build_tiny_head, build_tiny_model
from tests.kinds_fixture import LABELS, build_classification

REPO = Path(__file__).resolve().parent.parent
TASK = "area"
ITEMS = 12


def _seed(home: Path, tmp: Path) -> tuple[dict[str, Path], Path, dict[str, str]]:
    base = build_tiny_model(tmp / "base", seed=31)
    heads = {
        "a": build_tiny_head(base, tmp / "a", seed=32),
        "b": build_tiny_head(base, tmp / "b", seed=33, lora=False),
    }
    folder = build_classification(tmp / "area", splits={"test": ITEMS, "train": 9})
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    reg.add_suite(declare("area-suite", "classification", folder)[0])
    reg.add_task(TASK, suite="area-suite")
    reg.add_task("other", suite="area-suite")
    reg.add_model("tiny", path=base)
    for name, head in heads.items():
        record = TrainingRecord("0" * 64, "train", {}, 0, "test", suite="area-suite")
        reg.register_adapter(f"tiny-{name}", base="tiny", source_dir=head, training=record)
        reg.add_candidate(TASK, name=name, adapter=f"tiny-{name}", kind="classifier")
        run_eval(reg, TASK, name, EvalPaths(cache_dir=home / "cache"))
    reg.promote(TASK, "a", reason="first champion")
    # Every labelled item of the replay makes one live version; no drift window fills.
    reg.set_production_settings(TASK, live_every=ITEMS, drift_window=10_000)
    reg.start_shadow(TASK, "b", sample_rate=1.0, reason="compare b on live traffic")
    keys = {
        "area": reg.create_api_key("app", roles=["caller"], tasks=[TASK])[1],
        "other": reg.create_api_key("elsewhere", roles=["caller"], tasks=["other"])[1],
    }
    reg.close()
    return {"base": base, **heads}, folder, keys


def _rows(folder: Path) -> list[dict[str, str]]:
    lines = (folder / "test.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@pytest.mark.slow  # a whole fleet: two sidecars with their runtimes, re-evaluation subprocesses
def test_shadow_feedback_live_split_and_reevaluation_through_taskfleet_up(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    models, folder, keys = _seed(home, tmp_path)
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

        def shadow_serving() -> bool:
            workers = reg.list_workers(reachable_only=True)
            holders = [w.worker_id for w in workers if f"{TASK}.shadow" in w.epochs]
            champions = [w.worker_id for w in workers if TASK in w.epochs]
            # The shadow runs beside the champion, on the other worker.
            return bool(holders and champions and not set(holders) & set(champions))

        wait_until(shadow_serving, timeout_s=90, every_s=0.5)

        rows = _rows(folder)
        champion_labels: list[str] = []
        with Client(gateway, keys["area"], max_retries=30) as client:
            for row in rows:
                reply = client.classify(TASK, [row["text"]])
                assert reply.sampled and reply.request_id is not None
                champion_labels += reply.predictions()
                client.feedback(reply.request_id, label=row["label"])
            last = reply.request_id

        # Bad feedback: one documented 4xx each, in the one error shape.
        def feedback(body: dict[str, object], key: str = keys["area"]) -> httpx.Response:
            return httpx.post(
                f"{gateway}/v1/feedback", json=body, headers={"Authorization": f"Bearer {key}"}
            )

        mine, theirs, label = keys["area"], keys["other"], LABELS[0]
        refusals = {
            "again": ({"request_id": last, "label": label}, mine, 409, "FEEDBACK_EXISTS"),
            "unknown": ({"request_id": "f" * 32, "label": label}, mine, 404, "UNKNOWN_REQUEST"),
            "label": ({"request_id": last, "label": "zoll"}, mine, 400, "BAD_REQUEST"),
            "index": ({"request_id": last, "label": label, "index": 1}, mine, 400, "BAD_REQUEST"),
            "scope": ({"request_id": last, "label": label}, theirs, 403, "FORBIDDEN"),
            "shape": ({"request_id": last}, mine, 400, "BAD_REQUEST"),
        }
        for what, (body, key, status, code) in refusals.items():
            r = feedback(body, key)
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), (what, r.text)

        # The control plane keeps every sample with the shadow's side, and the agreement it
        # reports is the share of inputs both models labelled alike.
        def judged() -> object:
            summary = reg.agreement_summary(TASK)
            return summary if summary.outcomes.get("ok") == ITEMS else None

        summary = wait_until(judged, timeout_s=60, every_s=0.5)
        shadow = ModelClassifier(ModelSpec(models["base"], models["b"])).classifier()
        texts = [row["text"] for row in rows]
        shadow_labels = [shadow.labels[i] for i in np.argmax(shadow.predict_proba(texts), axis=1)]
        same = np.mean([a == b for a, b in zip(champion_labels, shadow_labels, strict=True)])
        assert summary.estimate == pytest.approx(float(same), abs=1e-12)  # type: ignore[attr-defined]
        assert summary.shadow == "b" and summary.inputs == ITEMS  # type: ignore[attr-defined]

        # The feedback became a live version; champion and shadow were re-evaluated on it.
        def live_runs() -> dict[str, object] | None:
            suite = reg.get_suite("area-suite")
            if suite.live_split is None:
                return None
            runs = {
                r.candidate: r
                for r in reg.list_eval_runs(TASK)
                if r.suite_fingerprint == suite.fingerprint and r.split == "live"
            }
            states = {r.state for r in reg.list_reevaluations(TASK)}
            return runs if set(runs) == {"a", "b"} and states == {"done"} else None

        runs = wait_until(live_runs, timeout_s=240, every_s=1.0)
        assert reg.live_counts(TASK) == (ITEMS, 0)  # recorded once each, all in the version
        live = reg.get_suite("area-suite")
        offline = declare("offline", "classification", _only(rows, tmp_path / "offline"))[0]
        from evals.suites import SuiteSpec

        spec = SuiteSpec(
            name="offline", kind="classification", location=Path(offline.location),
            test_split="test",
        )  # fmt: skip
        for name in ("a", "b"):
            run = runs[name]
            assert len(run.per_query) == ITEMS  # type: ignore[attr-defined]
            assert set(run.per_query) == set(runs["a"].per_query)  # type: ignore[attr-defined]
            alone = evaluate(spec, "test", ModelClassifier(ModelSpec(models["base"], models[name])))
            assert run.metrics["macro_f1"] == pytest.approx(  # type: ignore[attr-defined]
                alone.metrics["macro_f1"], abs=1e-9
            )
        # Champion and shadow, each on the new version's test and live splits, one at a time.
        assert sorted((r.candidate, r.split) for r in reg.list_reevaluations(TASK)) == [
            ("a", "live"), ("a", "test"), ("b", "live"), ("b", "test"),
        ]  # fmt: skip
        assert live.version == 2 and live.stats["live"]["items"] == ITEMS
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
