"""The fleet control loop against a real nats-server: placement publisher (outbox) and the
fleet watcher (heartbeats -> registry), including NATS being down and coming back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import pytest

from registry import Registry
from registry import entities as e
from serving import protocol as p
from serving.embedded_nats import EmbeddedNats
from serving.fleet_watcher import FleetWatcher
from serving.nats_layout import ensure_layout
from serving.publisher import (
    PlacementPublisher,
    decode_placement,
    model_key,
    placement_value,
    publish_pending,
    put_placement,
)
from testbed.fleet import eventually, register_served_task, unique_task
from testbed.tiny_model import build_tiny_adapter
from tests.nats_fixture import running_nats


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    with running_nats(tmp_path_factory.mktemp("nats")) as server:
        yield server


@pytest.fixture
def sqlite_registry(tmp_path: Path) -> Iterator[Registry]:
    reg = Registry.open(
        f"sqlite:///{tmp_path / 'registry.db'}", artifact_dir=tmp_path / "artifacts", actor="t"
    )
    yield reg
    reg.close()


async def _kv_value(url: str, task: str) -> p.PlacementValue | None:
    nc = await nats.connect(url)
    try:
        kv = (await ensure_layout(nc.jetstream())).placements
        try:
            entry = await kv.get(task)
        except nats.js.errors.KeyNotFoundError:
            return None
        return decode_placement(entry.value or b"")
    finally:
        await nc.close()


def test_placement_value_names_weights_by_content(
    sqlite_registry: Registry, tiny_model_path: Path, tmp_path: Path
) -> None:
    adapter_dir = build_tiny_adapter(tiny_model_path, tmp_path / "adapter")
    task = unique_task()
    placement = register_served_task(
        sqlite_registry, task, tiny_model_path, adapter_dir=adapter_dir, pinned=True
    )
    value, folders = placement_value(sqlite_registry, placement)
    base = sqlite_registry.get_model(f"m-{task}")
    adapter = sqlite_registry.get_adapter(f"a-{task}")
    assert value.model_key == f"{base.name}-{base.sha256[:12]}+{adapter.name}-{adapter.sha256[:12]}"
    assert value.model_key == model_key(base, adapter)
    assert value.base == p.Artifact(sha256=base.sha256, size=base.size_bytes)
    assert value.adapter == p.Artifact(sha256=adapter.sha256, size=adapter.size_bytes)
    assert folders.base == (tiny_model_path, base.sha256)
    assert folders.adapter is not None
    assert Path(folders.adapter[0], "adapter_config.json").is_file()
    assert value.memory_bytes == base.size_bytes + adapter.size_bytes > 0
    assert (value.epoch, value.pinned, value.replicas, value.task) == (1, True, 1, task)
    # Round trip through the wire encoding the sidecar reads.
    assert decode_placement(p.pack(value)) == value


def test_publisher_publishes_outbox_and_never_overwrites_newer_epoch(
    nats_server: EmbeddedNats, sqlite_registry: Registry, tiny_model_path: Path
) -> None:
    fresh, stale = unique_task(), unique_task()
    register_served_task(sqlite_registry, fresh, tiny_model_path)
    register_served_task(sqlite_registry, stale, tiny_model_path, model_name="shared")

    async def scenario() -> None:
        nc = await nats.connect(nats_server.url)
        try:
            layout = await ensure_layout(nc.jetstream())
            kv = layout.placements
            # Another publisher already wrote epoch 7 for `stale`: ours (epoch 1) must not win.
            outbox = sqlite_registry.unpublished_placements()
            newer, _ = placement_value(sqlite_registry, next(x for x in outbox if x.task == stale))
            newer = p.PlacementValue(**{**p.to_wire(newer), "epoch": 7})  # type: ignore[arg-type]
            await put_placement(kv, newer)
            result = await publish_pending(sqlite_registry, kv, layout.artifacts)
            assert sorted(result.published) == sorted([(fresh, 1), (stale, 1)])
            assert result.failed == []
            assert sqlite_registry.unpublished_placements() == []
            assert (await _kv_value(nats_server.url, fresh)).epoch == 1  # type: ignore[union-attr]
            assert (await _kv_value(nats_server.url, stale)).epoch == 7  # type: ignore[union-attr]
            # Nothing left: a second pass does nothing.
            assert (await publish_pending(sqlite_registry, kv, layout.artifacts)).published == []
        finally:
            await nc.close()

    asyncio.run(scenario())


def test_publisher_waits_out_a_nats_outage(
    tmp_path: Path, sqlite_registry: Registry, tiny_model_path: Path
) -> None:
    """Promoted while NATS is down: published as soon as NATS is back, then marked."""
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    url = server.url
    server.stop()  # same port and store dir later
    task = unique_task()
    register_served_task(sqlite_registry, task, tiny_model_path)

    async def scenario() -> None:
        publisher = PlacementPublisher(sqlite_registry, url, poll_interval_s=0.1)
        running = asyncio.create_task(publisher.run())
        await asyncio.sleep(1.5)
        assert sqlite_registry.unpublished_placements() != []
        server.start()
        try:
            value = await eventually(lambda: _kv_value(url, task), timeout_s=20)
            assert value.epoch == 1
            await eventually(lambda: _async(not sqlite_registry.unpublished_placements()))
            # A new epoch while running is published within a poll or two.
            sqlite_registry.update_placement(task, pinned=True)  # epoch 1 was lazy
            value = await eventually(lambda: _epoch_at_least(url, task, 2))
            assert value.pinned
            # NATS restarts under the running publisher: it reconnects and goes on.
            server.stop()
            sqlite_registry.update_placement(task, replicas=2)
            await asyncio.sleep(1.0)
            server.start()
            value = await eventually(lambda: _epoch_at_least(url, task, 3), timeout_s=25)
            assert value.replicas == 2
        finally:
            publisher.stop()
            await asyncio.wait_for(running, 10)
            server.cleanup()

    asyncio.run(scenario())


def test_a_placement_committed_in_this_process_is_published_before_the_next_poll(
    nats_server: EmbeddedNats, sqlite_registry: Registry, tiny_model_path: Path
) -> None:
    """The publisher polls once a minute here, yet what this process's registry commits
    reaches KV within seconds: the commit signal starts the next pass at once."""
    first, second = unique_task(), unique_task()
    register_served_task(sqlite_registry, first, tiny_model_path)

    async def scenario() -> None:
        publisher = PlacementPublisher(sqlite_registry, nats_server.url, poll_interval_s=60)
        running = asyncio.create_task(publisher.run())
        try:
            # The first pass (at start) published the first task; the next poll is a minute
            # away.
            await eventually(lambda: _kv_value(nats_server.url, first), timeout_s=20)
            register_served_task(sqlite_registry, second, tiny_model_path)
            began = time.monotonic()
            value = await eventually(lambda: _kv_value(nats_server.url, second), timeout_s=15)
            assert value.epoch == 1
            assert time.monotonic() - began < 15
            await eventually(lambda: _async(not sqlite_registry.unpublished_placements()))
        finally:
            publisher.stop()
            await asyncio.wait_for(running, 10)

    asyncio.run(scenario())


async def _async(value: bool) -> bool:
    return value


async def _epoch_at_least(url: str, task: str, epoch: int) -> p.PlacementValue | None:
    value = await _kv_value(url, task)
    return value if value is not None and value.epoch >= epoch else None


def _beat(worker_id: str, epochs: dict[str, int], ts: float | None = None) -> bytes:
    return p.pack(
        p.WorkerHeartbeat(
            worker_id=worker_id,
            host="box",
            ts_ms=int((ts or time.time()) * 1000),
            loaded=["m-abc"],
            memory_used=1000,
            memory_budget=8000,
            queue_depth=dict.fromkeys(epochs, 3),
            runtimes=["torch"],
            epochs=epochs,
        )
    )


def test_fleet_watcher_mirrors_heartbeats_and_notices_silence(
    nats_server: EmbeddedNats, sqlite_registry: Registry, tiny_model_path: Path
) -> None:
    task = unique_task()
    register_served_task(sqlite_registry, task, tiny_model_path)
    a, b = unique_task("wa"), unique_task("wb")

    async def scenario() -> None:
        nc = await nats.connect(nats_server.url)
        watcher = FleetWatcher(
            sqlite_registry, nats_server.url, flush_interval_s=0.2, stale_after_s=2.0
        )
        running = asyncio.create_task(watcher.run())
        try:
            kv = (await ensure_layout(nc.jetstream())).workers
            await kv.put(a, _beat(a, {task: 1}))
            await kv.put(b, _beat(b, {}))

            def mirrored() -> list[e.Worker]:
                mine = [w for w in sqlite_registry.list_workers() if w.worker_id in (a, b)]
                return mine if len(mine) == 2 and all(w.reachable for w in mine) else []

            workers = await eventually(lambda: _async_value(mirrored))
            wa = next(w for w in workers if w.worker_id == a)
            assert (wa.loaded, wa.memory_used, wa.memory_budget) == (["m-abc"], 1000, 8000)
            assert wa.queue_depth == {task: 3} and wa.epochs == {task: 1}
            status = next(s for s in sqlite_registry.placement_status() if s.task == task)
            assert status.reported == {a: 1} and status.converged

            # b shuts down cleanly (deletes its key); a keeps beating, then goes silent.
            await kv.delete(b)
            for _ in range(3):
                await kv.put(a, _beat(a, {task: 1}))
                await asyncio.sleep(0.5)
            assert {w.worker_id: w.reachable for w in sqlite_registry.list_workers()}[b] is False
            assert {w.worker_id: w.reachable for w in sqlite_registry.list_workers()}[a] is True

            def a_unreachable() -> bool:
                return not {w.worker_id: w.reachable for w in sqlite_registry.list_workers()}[a]

            await eventually(lambda: _async_value(a_unreachable), timeout_s=6)
            status = next(s for s in sqlite_registry.placement_status() if s.task == task)
            assert status.reported == {} and not status.converged
        finally:
            watcher.stop()
            await asyncio.wait_for(running, 10)
            await nc.close()

    asyncio.run(scenario())


async def _async_value(fn):  # type: ignore[no-untyped-def]
    return fn()


def test_worker_reports_on_both_databases(registry: Registry) -> None:
    now = datetime.now(UTC)
    report = e.WorkerReport(
        worker_id="w1",
        host="h",
        reported_at=now,
        loaded=["k"],
        memory_used=5,
        memory_budget=10,
        queue_depth={"t": 1},
        runtimes=["torch"],
        epochs={"t": 2},
    )
    registry.record_worker_report(report)
    # An older heartbeat replayed later never replaces the newer one.
    older = e.WorkerReport(
        **{**report.__dict__, "reported_at": now - timedelta(seconds=5), "loaded": []}
    )
    assert registry.record_worker_report(older).loaded == ["k"]
    assert registry.mark_workers_unreachable(seen_before=now - timedelta(seconds=60)) == []
    assert registry.mark_workers_unreachable(seen_before=now + timedelta(seconds=60)) == ["w1"]
    assert registry.list_workers(reachable_only=True) == []
    assert registry.forget_workers(now + timedelta(seconds=60)) == ["w1"]
    assert registry.list_workers() == []


def test_dead_letters_are_listed_and_replayed_as_new_requests(nats_server: EmbeddedNats) -> None:
    """The DLQ tools on the format a sidecar dead-letters in (original message + Tf-Error);
    the real sidecar producing it is covered by tests/test_e2e_dlq.py."""
    from serving.dlq import DeadLetterNotFound, list_dead_letters, replay
    from serving.nats_layout import TASKS_STREAM, dlq_subject, task_subject

    task = unique_task("dead")
    payload = p.pack(p.QueuePayload(task=task, kind="query", inputs=["a", "b"]))
    original = {
        "Nats-Msg-Id": "req-1",
        "Tf-Request-Id": "req-1",
        "Tf-Reply": "_tf.reply.gone.req-1",
        "Tf-Deadline": "1",
        "Tf-Priority": "0",
        "Tf-Error": "LOAD_FAILED: base model folder does not exist",
    }

    async def scenario() -> None:
        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            await ensure_layout(js)
            await js.publish(dlq_subject(task), payload, headers=original)
            (letter,) = await list_dead_letters(js, task)
            assert (letter.task, letter.request_id) == (task, "req-1")
            assert letter.error.startswith("LOAD_FAILED") and letter.summary == "2 query text(s)"

            consumer = await js.pull_subscribe(task_subject(task), durable=f"check_{task}")
            (outcome,) = await replay(nc, [letter.seq], wait_s=0)
            (msg,) = await consumer.fetch(1, timeout=5)
            assert msg.data == payload
            headers = msg.headers or {}
            assert headers["Tf-Request-Id"] == headers["Nats-Msg-Id"] == outcome.request_id
            assert outcome.request_id != "req-1"  # the duplicate window would drop the old id
            # The old deadline has passed and the old requester is gone; the error is history.
            assert not {"Tf-Deadline", "Tf-Reply", "Tf-Error"} & set(headers)
            assert headers["Tf-Priority"] == "0"
            await msg.ack()
            assert await list_dead_letters(js, task) == []
            with pytest.raises(DeadLetterNotFound):
                await replay(nc, [letter.seq])
            await js.delete_consumer(TASKS_STREAM, f"check_{task}")
        finally:
            await nc.close()

    asyncio.run(scenario())
