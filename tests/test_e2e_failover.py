"""End to end under failure: a sidecar killed with SIGKILL mid-stream loses no request, and
a NATS restart is survived by the gateway, the sidecars and the control loops."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import numpy as np
import pytest
from nats.js.api import ConsumerInfo

from serving.client import AsyncClient, Client, TaskfleetError
from serving.nats_layout import TASKS_STREAM, consumer_name
from testbed.faults.injectors import freeze_runtime, kill_sidecar, wait_holding
from testbed.fleet import LocalFleet, register_served_task, unique_task, wait_until


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[LocalFleet]:
    stack = LocalFleet(tmp_path, workers=2).start()
    try:
        yield stack
    finally:
        stack.stop()


def _in_process(model_path: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_path), device="cpu", local_files_only=True)
    return np.asarray(model.encode(texts, convert_to_numpy=True), dtype=np.float32)


async def _consumer(url: str, task: str) -> ConsumerInfo:
    nc = await nats.connect(url)
    try:
        return await nc.jetstream().consumer_info(TASKS_STREAM, consumer_name(task))
    finally:
        await nc.close()


def test_sigkill_of_a_sidecar_loses_no_request(fleet: LocalFleet, tiny_model_path: Path) -> None:
    task = unique_task("kill")
    placement = register_served_task(fleet.reg, task, tiny_model_path, pinned=True, replicas=2)
    try:
        fleet.serving(task, placement.epoch, workers=2)
    except AssertionError:
        pytest.fail(f"both workers should serve the task:\n{fleet.logs()}")
    # Messages the killed worker held come back after ack_wait: the test relies on it being
    # short (the sidecars created the consumer with --ack-wait-ms 5000).
    assert fleet.nats is not None
    assert (asyncio.run(_consumer(fleet.nats.url, task)).config.ack_wait or 99) <= 5.0

    texts = [f"frage {i} zur kündigung der wohnung nach {i % 7} jahren" for i in range(240)]
    expected = _in_process(tiny_model_path, texts)
    answers: dict[int, list[object]] = {i: [] for i in range(len(texts))}
    latencies: list[float] = []
    done = 0
    victim = fleet.sidecars[0]

    async def stream() -> None:
        nonlocal done
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(len(texts)):
            queue.put_nowait(i)
        async with AsyncClient(fleet.gateway_url, timeout_s=60, max_retries=20) as client:

            async def caller() -> None:
                nonlocal done
                while not queue.empty():
                    i = queue.get_nowait()
                    begun = time.monotonic()
                    try:
                        answers[i].append(
                            (await client.embed(task, texts[i], kind="query", timeout_ms=45_000))[0]
                        )
                    except TaskfleetError as exc:
                        answers[i].append(exc)
                    latencies.append(time.monotonic() - begun)
                    done += 1

            await asyncio.gather(*(caller() for _ in range(12)))

    def kill_when_busy() -> None:
        wait_until(lambda: done >= 40, timeout_s=40, every_s=0.01)
        # A tiny model answers in milliseconds, so the victim may hold nothing at the instant
        # of a kill: with its runtime frozen, what it pulls stays held until the kill.
        freeze_runtime(victim)
        wait_holding(fleet, victim, task, timeout_s=20)
        kill_sidecar(victim)  # SIGKILL: no drain, no ack, no goodbye heartbeat

    killer = threading.Thread(target=kill_when_busy)
    killer.start()
    started = time.monotonic()
    asyncio.run(stream())
    killer.join()
    assert not victim.running()
    failures = {i: a for i, a in answers.items() if len(a) != 1 or isinstance(a[0], Exception)}
    assert not failures, f"{len(failures)} requests without exactly one answer: " + str(
        dict(list(failures.items())[:5])
    )
    got = np.stack([answers[i][0] for i in range(len(texts))])  # type: ignore[arg-type]
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert time.monotonic() - started < 50
    # Requests the victim held were answered only after JetStream redelivered them.
    print(f"slowest request: {max(latencies):.1f}s")
    # The survivor keeps serving; the dead one drops out of the registry's view.
    survivor = fleet.sidecars[1].worker_id
    wait_until(
        lambda: (
            {w.worker_id: w.reachable for w in fleet.reg.list_workers()}.get(victim.worker_id)
            is False
        ),
        timeout_s=20,
    )
    assert {w.worker_id: w.reachable for w in fleet.reg.list_workers()}[survivor]


def test_nats_restart_gateway_and_sidecars_reconnect(
    fleet: LocalFleet, tiny_model_path: Path
) -> None:
    task = unique_task("restart")
    placement = register_served_task(fleet.reg, task, tiny_model_path, pinned=True, replicas=2)
    fleet.serving(task, placement.epoch, workers=2)
    expected = _in_process(tiny_model_path, ["vor dem neustart", "nach dem neustart"])
    with Client(fleet.gateway_url, max_retries=30) as client:
        before = client.embed(task, "vor dem neustart")
        np.testing.assert_allclose(before[0], expected[0], atol=1e-5)

        assert fleet.nats is not None
        fleet.nats.stop()  # same port and store dir on restart
        time.sleep(1.0)
        fleet.nats.start()

        deadline = time.monotonic() + 40
        while True:
            try:
                after = client.embed(task, "nach dem neustart", timeout_ms=10_000)
                break
            except TaskfleetError:
                if time.monotonic() > deadline:
                    pytest.fail(f"no answer after the NATS restart:\n{fleet.logs()}")
                time.sleep(0.5)
        np.testing.assert_allclose(after[0], expected[1], atol=1e-5)

    # The control loops reconnected too: a new placement epoch reaches the workers.
    # (a change of pinned/replicas is a new epoch; the same values are none)
    fleet.reg.update_placement(task, pinned=False)
    fleet.serving(task, placement.epoch + 1, workers=2)
