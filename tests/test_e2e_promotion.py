"""End to end: a task is promoted from model A to model B and rolled back while a client keeps
calling it by name. Every request succeeds, replies switch model after each promotion, and the
epoch in replies never goes backwards (real nats-server, sidecar, runtime, gateway, publisher).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from serving.client import Client
from testbed.declared_tasks import add_task
from testbed.fleet import LocalFleet, unique_task, wait_until
from testbed.tiny_model import build_tiny_model
from tests.evalrun_fixture import record_run

TEXT = "Der Vermieter behält die Kaution."


@dataclass
class Reply:
    at: float
    epoch: int
    model_key: str
    vector: np.ndarray


def _caller(url: str, task: str, stop: threading.Event, replies: list[Reply], errors: list[str]):
    with Client(url, timeout_s=30) as client:
        while not stop.is_set():
            try:
                got = client.embed_with_info(task, [TEXT], kind="query")
            except Exception as exc:  # every failure is a finding, not a crash of the caller
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            replies.append(Reply(time.monotonic(), got.epoch, got.model_key, got.vectors[0]))


def test_promote_and_roll_back_under_load(tmp_path: Path) -> None:
    model_a = build_tiny_model(tmp_path / "model-a", seed=0)
    model_b = build_tiny_model(tmp_path / "model-b", seed=1)
    fleet = LocalFleet(tmp_path / "fleet", workers=1).start()
    stop = threading.Event()
    caller: threading.Thread | None = None
    try:
        reg = fleet.reg
        task = unique_task("promo")
        add_task(reg, task, suite="test-suite", margin=0.01)
        reg.add_model("model-a", path=model_a)
        reg.add_model("model-b", path=model_b)
        reg.add_candidate(task, base="model-a")
        reg.add_candidate(task, base="model-b")
        record_run(reg, task, "model-a", 0.30)
        record_run(reg, task, "model-b", 0.40)

        first = reg.promote(task, "model-a", reason="first champion")
        fleet.serving(task, first.epoch)

        replies: list[Reply] = []
        errors: list[str] = []
        caller = threading.Thread(
            target=_caller, args=(fleet.gateway_url, task, stop, replies, errors), daemon=True
        )
        caller.start()
        wait_until(lambda: len(replies) >= 5, timeout_s=30)

        promoted_at = time.monotonic()
        second = reg.promote(task, "model-b", reason="beats A")
        wait_until(lambda: any(r.epoch == second.epoch for r in replies), timeout_s=60)
        wait_until(lambda: sum(r.epoch == second.epoch for r in replies) >= 5, timeout_s=30)

        rolled_at = time.monotonic()
        third = reg.rollback(task, reason="back to A")
        wait_until(lambda: sum(r.epoch == third.epoch for r in replies) >= 5, timeout_s=60)
    finally:
        stop.set()
        if caller is not None:
            caller.join(timeout=60)
        logs = fleet.logs()
        fleet.stop()

    assert not errors, f"requests failed during the switch: {errors[:5]}\n{logs}"
    epochs = [r.epoch for r in replies]
    assert epochs == sorted(epochs), f"epoch went backwards: {epochs}"
    assert set(epochs) == {first.epoch, second.epoch, third.epoch}

    by_epoch = {r.epoch: r.model_key for r in replies}
    assert by_epoch[first.epoch].startswith("model-a-")
    assert by_epoch[second.epoch].startswith("model-b-")
    assert by_epoch[third.epoch] == by_epoch[first.epoch]
    # Nothing switched before the promotion was made.
    assert all(r.epoch == first.epoch for r in replies if r.at < promoted_at)
    assert all(r.epoch <= second.epoch for r in replies if r.at < rolled_at)
    # The switch is real: the two models embed the text differently, and each epoch's replies
    # are identical to one another (no half-loaded model answered).
    vectors = {e: [r.vector for r in replies if r.epoch == e] for e in set(epochs)}
    for same in vectors.values():
        np.testing.assert_allclose(np.stack(same), np.stack([same[0]] * len(same)), atol=1e-6)
    assert not np.allclose(vectors[first.epoch][0], vectors[second.epoch][0], atol=1e-3)
    np.testing.assert_allclose(vectors[third.epoch][0], vectors[first.epoch][0], atol=1e-6)
