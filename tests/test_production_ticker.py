"""The leader's production ticker on a real registry and suite folder, without a fleet: what it
makes of kept samples (drift windows: a replay of the suite's own test split in 20 windows
raises the flag at most once, traffic of one label raises it) and of a changed suite folder
(the champion's evidence is stale after one tick, promotion on it is refused in one line, and
the re-evaluation, a real `taskfleet eval run` subprocess, lands by itself).

The champion is a logistic-regression head on a tiny model's frozen embeddings, fitted on the
suite's train split (`taskfleet finetune head`): a classifier that tells the labels
apart, so one label's traffic moves its predictions. Its predictions on the replayed inputs,
computed with the eval harness's model library, are what its reply would carry; the samples
hold them as the control plane keeps a served champion's.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from evals.classification_data import ClassificationSplit
from evals.classifiers import ModelClassifier
from evals.runner import EvalPaths, run_eval
from evals.suites import SuiteSpec, declare
from finetune.pipeline import HeadRequest, finetune_head
from registry import Registry
from registry import entities as e
from registry.entities import TrainingRecord
from registry.promotions import EvidenceStale
from serving.runtime.model_folder import ModelSpec
from taskfleet.production import ProductionTicker, ShellPaths, SuiteJudge
from testbed.tiny_model import build_tiny_head, build_tiny_model
from tests.kinds_fixture import LABELS, build_classification

TASK = "area"
CHAMPION = "tiny+head"
WINDOW = 15
WINDOWS = 20


def _open(tmp_path: Path) -> tuple[Registry, ProductionTicker, Path, ModelSpec]:
    home = tmp_path / "home"
    home.mkdir()
    folder = build_classification(
        tmp_path / "area", splits={"test": WINDOW * WINDOWS, "train": 150}, seed=5
    )
    url = f"sqlite:///{home / 'registry.db'}"
    reg = Registry.open(url, artifact_dir=home / "artifacts")
    reg.add_suite(declare("area-suite", "classification", folder)[0])
    reg.add_task(TASK, suite="area-suite")
    base = build_tiny_model(tmp_path / "base", seed=41)
    reg.add_model("tiny", path=base)
    paths = EvalPaths(cache_dir=home / "cache")
    fitted = finetune_head(
        reg, HeadRequest(task=TASK, base="tiny", name="head"), cache_dir=paths.cache_dir
    )
    assert fitted.candidate.name == CHAMPION
    other = build_tiny_head(base, tmp_path / "other", seed=42)
    record = TrainingRecord("0" * 64, "train", {}, 0, "test", suite="area-suite")
    reg.register_adapter("other", base="tiny", source_dir=other, training=record)
    reg.add_candidate(TASK, name="other", adapter="other", kind="classifier")
    run_eval(reg, TASK, "other", paths)
    reg.promote(TASK, CHAMPION, reason="first champion")
    shell = ShellPaths(home=home, database_url=url, data_root=None, eval_paths=paths)
    ticker = ProductionTicker(reg, SuiteJudge(reg, paths), shell, tick_s=0.2)
    return reg, ticker, folder, ModelSpec(base, reg.adapter_path("head"))


def _predicted(
    folder: Path, split: str, champion: ModelSpec
) -> tuple[list[str], list[str], list[str]]:
    """A split's texts, gold labels and the champion's label for each (what its reply says)."""
    spec = SuiteSpec(name="area", kind="classification", location=folder, test_split="test")
    data = spec.load(split)
    assert isinstance(data, ClassificationSplit)
    model = ModelClassifier(champion).classifier()
    best = np.argmax(model.predict_proba(list(data.texts)), axis=1)
    return list(data.texts), list(data.labels), [model.labels[i] for i in best]


def _keep(reg: Registry, prefix: str, texts: list[str], predicted: list[str]) -> None:
    """Each input as one sampled single-input request the champion answered."""
    for n, (text, label) in enumerate(zip(texts, predicted, strict=True)):
        reg.record_sample(
            e.SampleCreate(
                task=TASK,
                request_id=f"{prefix}{n:030d}",
                received_at=datetime.now(UTC),
                inputs=1,
                champion=CHAMPION,
                champion_model_key=CHAMPION,
                champion_epoch=1,
                champion_ms=1.0,
                shadow=None,
                lengths=[len(text.split())],
                predicted=[label],
            )
        )


@pytest.mark.slow  # one eval subprocess, 2,000 resamples per drift window
def test_drift_flags_one_labels_traffic_and_rarely_the_suites_own(tmp_path: Path) -> None:
    reg, ticker, folder, champion = _open(tmp_path)
    try:
        reg.set_production_settings(TASK, drift_window=WINDOW)
        texts, _, predicted = _predicted(folder, "test", champion)
        _keep(reg, "a", texts, predicted)
        for _ in range(WINDOWS + 2):
            ticker.tick()
        own = reg.drift_windows(TASK)
        assert len(own) == WINDOWS and all(w.size == WINDOW for w in own)
        false_alarms = sum(w.drifted for w in own)
        print(f"own test split: {false_alarms} of {WINDOWS} windows flagged")
        assert false_alarms <= 1

        # Traffic of one label only (train items, which the suite's test split does not hold).
        train_texts, gold, train_predicted = _predicted(folder, "train", champion)
        rows = zip(train_texts, gold, train_predicted, strict=True)
        only = [(t, p) for t, g, p in rows if g == LABELS[0]]
        _keep(reg, "b", [t for t, _ in only], [p for _, p in only])
        for _ in range(len(only) // WINDOW + 1):
            ticker.tick()
        shifted = reg.drift_windows(TASK)[: len(only) // WINDOW]
        print(f"one label: {sum(w.drifted for w in shifted)} of {len(shifted)} windows flagged")
        assert shifted and all(w.drifted for w in shifted), [w.p_min for w in shifted]
        label = next(s for s in shifted[0].signals if s["name"] == "label")
        assert label["p_value"] < shifted[0].alpha
    finally:
        reg.close()


@pytest.mark.slow  # the re-evaluation is a real `taskfleet eval run` subprocess
def test_a_changed_suite_folder_is_stale_after_one_tick_and_refreshed_by_itself(
    tmp_path: Path,
) -> None:
    reg, ticker, folder, _ = _open(tmp_path)
    try:
        # A changed folder: one test item relabelled, registered again (version 2).
        rows = [json.loads(line) for line in (folder / "test.jsonl").read_text().splitlines()]
        rows[0]["label"] = next(label for label in LABELS if label != rows[0]["label"])
        (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert reg.add_suite(declare("area-suite", "classification", folder)[0])[0].version == 2

        ticker.tick()
        queued = reg.list_reevaluations(TASK)
        assert sorted((r.candidate, r.split, r.state, r.suite_version) for r in queued) == [
            ("other", "test", "queued", 2), (CHAMPION, "test", "queued", 2),
        ]  # fmt: skip
        assert queued[-1].reason.startswith("champion: its newest run is on area-suite v1")
        with pytest.raises(EvidenceStale) as refused:
            reg.promote(TASK, "other", reason="on old evidence")
        assert "\n" not in str(refused.value) and "taskfleet eval run area" in str(refused.value)

        async def until_refreshed() -> None:
            running = asyncio.create_task(ticker.run())
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                states = [r.state for r in await asyncio.to_thread(reg.list_reevaluations, TASK)]
                if states and all(s in ("done", "failed") for s in states):
                    break
                await asyncio.sleep(0.5)
            ticker.stop()
            await running

        asyncio.run(until_refreshed())
        jobs = reg.list_reevaluations(TASK)
        assert [(j.state, j.error) for j in jobs] == [("done", None), ("done", None)]
        newest = reg.get_suite("area-suite")
        for job in jobs:
            runs = [r for r in reg.list_eval_runs(TASK, job.candidate) if r.id == job.eval_run_id]
            assert runs and runs[0].suite_fingerprint == newest.fingerprint
        assert reg.stale_pairings(TASK) == []
    finally:
        reg.close()
