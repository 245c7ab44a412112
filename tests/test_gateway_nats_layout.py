"""serving.nats_layout and serving.embedded_nats against a real nats-server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import pytest
from nats.js.api import AckPolicy, RetentionPolicy, StorageType

from serving import nats_layout as layout
from serving.embedded_nats import EmbeddedNats, find_nats_server
from tests.nats_fixture import nats_available

pytestmark = pytest.mark.skipif(not nats_available(), reason="nats-server binary not installed")


def test_the_binary_comes_from_the_wheel() -> None:
    path = find_nats_server()
    assert path.name == "nats-server" and path.is_file()


def test_task_names_must_be_subject_tokens() -> None:
    assert layout.task_subject("german-legal_1") == "tasks.german-legal_1"
    assert layout.consumer_name("german-legal_1") == "task_german-legal_1"
    for bad in ["", "a.b", "a b", "a>", "*"]:
        with pytest.raises(layout.InvalidTaskName):
            layout.task_subject(bad)


async def _layout_twice(url: str) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        first = await layout.ensure_layout(js, ["alpha"])
        await first.placements.put("alpha", b"v1")
        # Again, with one more task: nothing is recreated, nothing is lost.
        second = await layout.ensure_layout(js, ["alpha", "beta"])
        assert (await second.placements.get("alpha")).value == b"v1"

        tasks = (await js.stream_info(layout.TASKS_STREAM)).config
        assert tasks.subjects == ["tasks.>"]
        assert tasks.retention == RetentionPolicy.WORK_QUEUE
        assert tasks.storage == StorageType.FILE
        assert tasks.max_age == layout.TASKS_MAX_AGE_S
        assert tasks.duplicate_window == layout.DUPLICATE_WINDOW_S
        assert (await js.stream_info(layout.DLQ_STREAM)).config.subjects == ["dlq.>"]

        for task in ("alpha", "beta"):
            consumer = (await js.consumer_info(layout.TASKS_STREAM, f"task_{task}")).config
            assert consumer.durable_name == f"task_{task}"
            assert consumer.filter_subject == f"tasks.{task}"
            assert consumer.ack_policy == AckPolicy.EXPLICIT
            assert consumer.ack_wait == layout.ACK_WAIT_S
            assert consumer.max_deliver == layout.MAX_DELIVER

        workers = await second.workers.status()
        assert workers.ttl == layout.WORKERS_TTL_S
        assert (await second.placements.status()).history == layout.PLACEMENTS_HISTORY
        await second.payloads.put("k", b"data")
        assert (await second.payloads.get("k")).data == b"data"

        # Concurrent callers (gateway and fleet starting together) both succeed.
        await asyncio.gather(*(layout.ensure_task_consumer(js, "gamma") for _ in range(5)))
    finally:
        await nc.close()


async def _messages(url: str) -> int:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await layout.ensure_layout(js, ["alpha"])
        return int((await js.stream_info(layout.TASKS_STREAM)).state.messages)
    finally:
        await nc.close()


async def _publish(url: str) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await layout.ensure_layout(js, ["alpha"])
        await js.publish("tasks.alpha", b"x", headers={"Nats-Msg-Id": "one"})
        ack = await js.publish("tasks.alpha", b"x", headers={"Nats-Msg-Id": "one"})
        assert ack.duplicate  # the duplicate window drops a retried publish
    finally:
        await nc.close()


def test_layout_is_idempotent_and_has_the_documented_settings(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path / "store") as server:
        asyncio.run(_layout_twice(server.url))


def test_a_restart_on_the_same_store_keeps_the_queue(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "store")
    try:
        server.start()
        asyncio.run(_publish(server.url))
        port = server.port
        server.stop()
        assert not server.running
        server.start()
        assert server.port == port
        assert asyncio.run(_messages(server.url)) == 1
    finally:
        server.cleanup()
    assert (tmp_path / "store").exists()  # a caller-given store dir is never removed


def test_a_store_dir_it_made_itself_is_removed() -> None:
    with EmbeddedNats() as server:
        store = server.store_dir
        assert store.exists()
    assert not store.exists()


async def _snapshots(url: str, rounds: int) -> list[set[str]]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        found = await layout.ensure_layout(js)
        await found.workers.put("gone", b"x")
        await found.workers.delete("gone")
        seen = []
        for n in range(rounds):
            await found.workers.put(f"w{n}", b"beat")
            seen.append(set(await layout.kv_values(js, layout.WORKERS_BUCKET)))
        return seen
    finally:
        await nc.close()


def test_a_kv_snapshot_holds_every_key_put_before_it(tmp_path: Path) -> None:
    """The gateway reads live workers this way; the first try (nats-py's watchall) sometimes
    ended before delivering values, and a worker that had just started looked absent."""
    with EmbeddedNats(tmp_path / "store") as server:
        seen = asyncio.run(_snapshots(server.url, 60))
    for n, keys in enumerate(seen):
        assert keys == {f"w{k}" for k in range(n + 1)}
