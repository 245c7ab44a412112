"""Samples and feedback survive kill -9 of the control plane: real `taskfleet serve` processes,
a real nats-server and one SQLite registry. Sampled requests and feedback wait in their
streams (as gateways publish them); the first control plane is killed mid-way through them,
the next one leads after the lock's TTL and takes what was not acknowledged from the durable
consumers: every sample and every labelled item ends up in the registry exactly once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats
import numpy as np

from registry import Registry
from serving import nats_layout
from serving import protocol as p
from serving.sample_records import ChampionSample, Feedback, encode, ttl_header
from testbed.fleet import wait_until
from tests.kinds_fixture import LABELS, build_classification
from tests.nats_fixture import running_nats
from tests.test_serve_leader import serving

TASK = "durable"
COUNT = 300


def _seed(home: Path, tmp: Path) -> None:
    from evals.suites import declare

    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    folder = build_classification(tmp / "suite", splits={"test": 6})
    reg.add_suite(declare("durable-suite", "classification", folder)[0])
    reg.add_task(TASK, suite="durable-suite")
    # No live version is cut and no drift window fills: this test is about the streams.
    reg.set_production_settings(TASK, live_every=100_000, drift_window=100_000)
    reg.close()


def _record(n: int) -> tuple[ChampionSample, Feedback]:
    request_id = f"{n:032x}"
    probabilities = np.full((1, len(LABELS)), 1 / len(LABELS), dtype=np.float32)
    probabilities[0, n % len(LABELS)] = 0.9
    reply = p.ClassifyReplyOk(
        request_id=request_id,
        model_key="m-key",
        epoch=1,
        count=1,
        labels=list(LABELS),
        probabilities=p.floats_to_bytes(probabilities),
    )
    sample = ChampionSample(
        task=TASK,
        kind="classification",
        request_id=request_id,
        ts_ms=int(time.time() * 1000),
        payload=p.pack(p.ClassifyPayload(task=TASK, inputs=[f"frage nummer {n} zur miete"])),
        reply=p.pack(reply),
        candidate="a",
        latency_ms=5.0,
        shadow=None,
        key="app",
    )
    said = Feedback(
        task=TASK, request_id=request_id, index=0, label=LABELS[n % 3], ts_ms=sample.ts_ms
    )
    return sample, said


async def _publish(url: str) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await nats_layout.ensure_layout(js)
        ttl = {"Nats-TTL": ttl_header(3600)}
        for n in range(COUNT):
            sample, said = _record(n)
            await js.publish(
                nats_layout.sample_subject(TASK, sample.request_id, "champion"),
                encode(sample),
                headers=ttl,
            )
            await js.publish(
                nats_layout.feedback_subject(TASK, said.request_id, 0), encode(said), headers=ttl
            )
    finally:
        await nc.close()


def test_samples_and_feedback_survive_kill9_of_the_control_plane(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    _seed(home, tmp_path)
    with running_nats(tmp_path / "nats") as server:
        asyncio.run(_publish(server.url))
        reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
        try:
            with serving(home, server.url, "first") as first:
                wait_until(lambda: reg.list_samples(TASK, limit=1), timeout_s=60, every_s=0.02)
                first.proc.kill()  # kill -9, mid-way
                first.proc.wait()
            kept = len(reg.list_samples(TASK, limit=COUNT))
            labelled = reg.live_counts(TASK)[0]
            assert kept < COUNT or labelled < COUNT, "the first control plane finished: too fast"
            with serving(home, server.url, "second"):
                wait_until(
                    lambda: (
                        len(reg.list_samples(TASK, limit=2 * COUNT)) == COUNT
                        and reg.live_counts(TASK)[0] == COUNT
                    ),
                    timeout_s=120,
                    every_s=0.5,
                )
                time.sleep(2)  # nothing more arrives: every message was taken once
                assert len(reg.list_samples(TASK, limit=2 * COUNT)) == COUNT
                assert reg.live_counts(TASK) == (COUNT, COUNT)
            items = {(i.request_id, i.index): i for i in reg.live_items(TASK)}
            assert len(items) == COUNT
            seventh = items[f"{7:032x}", 0]
            assert seventh.item == {"text": "frage nummer 7 zur miete", "label": LABELS[7 % 3]}
            sample = reg.get_sample(f"{7:032x}")
            assert sample is not None and sample.predicted == [LABELS[7 % 3]]
            print(f"kill -9 after {kept} samples and {labelled} labelled items of {COUNT}")
        finally:
            reg.close()
