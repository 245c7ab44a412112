"""A batch whose deadlines have all passed is dropped before it runs: a short request queued
behind a long batch is answered DEADLINE_EXCEEDED instead of being computed late.

The requests are published straight to the task's JetStream subject (as the gateway would), so
the test reads the worker's own reply, not the gateway's timer.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import nats
import pytest

from serving import nats_layout
from serving.protocol import QueuePayload, ReplyError, ReplyOk, from_wire, pack, unpack
from testbed.fleet import LocalFleet, register_served_task, unique_task
from tests.test_fleet_metrics import value

SIDECAR_ARGS = [
    "--heartbeat-ms", "300",
    "--max-batch-wait-ms", "50",
    "--max-batch-tokens", "4096",
]  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    with LocalFleet(tmp_path_factory.mktemp("deadlines"), sidecar_args=SIDECAR_ARGS) as stack:
        yield stack


async def _publish_and_collect(
    url: str,
    task: str,
    requests: list[tuple[list[str], int]],
    wait_s: float,
    after_first: Callable[[], Awaitable[None]] | None = None,
) -> list[ReplyOk | ReplyError | None]:
    """Publish each (texts, deadline in ms from now) and return each one's reply (or None);
    ``after_first`` runs between the first publish and the others."""
    nc = await nats.connect(url)
    replies: dict[str, ReplyOk | ReplyError] = {}
    prefix = f"_tf.test.{uuid.uuid4().hex[:8]}."

    async def on_reply(msg: nats.aio.msg.Msg) -> None:
        await msg.respond(b"")  # confirm, as a gateway does
        obj = unpack(msg.data)
        reply = from_wire(ReplyOk if obj.get("ok") else ReplyError, obj)
        replies[reply.request_id] = reply

    try:
        await nc.subscribe(prefix + ">", cb=on_reply)
        js = nc.jetstream()
        ids = []
        for texts, deadline_ms in requests:
            request_id = uuid.uuid4().hex
            ids.append(request_id)
            headers = {
                "Nats-Msg-Id": request_id,
                "Tf-Request-Id": request_id,
                "Tf-Reply": prefix + request_id,
                "Tf-Deadline": str(int(time.time() * 1000) + deadline_ms),
            }
            payload = pack(QueuePayload(task=task, kind="passage", inputs=texts))
            await js.publish(nats_layout.task_subject(task), payload, headers=headers)
            if after_first is not None and len(ids) == 1:
                await after_first()
        end = time.monotonic() + wait_s
        while time.monotonic() < end and len(replies) < len(ids):
            await asyncio.sleep(0.1)
        return [replies.get(i) for i in ids]
    finally:
        await nc.close()


def test_request_queued_behind_a_long_batch_is_dropped_not_computed(
    fleet: LocalFleet, minilm_path: Path
) -> None:
    task = unique_task("deadline")
    placement = register_served_task(fleet.reg, task, minilm_path, pinned=True)
    fleet.serving(task, placement.epoch)
    assert fleet.nats is not None
    clause = "der vermieter kann das mietverhältnis kündigen "
    # 192 texts of 256 tokens: 12 passes of --max-batch-tokens. CI ran one such pass in 8.2 s
    # (a starved machine), so the long request gets 300 s; the short one waits behind the rest.
    long_texts = [f"§ {i} " + clause * 40 for i in range(192)]

    async def long_batch_sent() -> None:
        # A lone request is sent at once, so the short one could reach the runtime before the
        # long batch does: it is published once the long batch has gone to the runtime.
        deadline = time.monotonic() + 60
        while value(fleet.sidecar_metrics(), "taskfleet_sidecar_batches_total", task=task) < 1:
            assert time.monotonic() < deadline, fleet.logs()
            await asyncio.sleep(0.02)

    started = time.monotonic()
    long, short = asyncio.run(
        _publish_and_collect(
            fleet.nats.url,
            task,
            [(long_texts, 300_000), (["kurze frage"], 1_500)],
            wait_s=300,
            after_first=long_batch_sent,
        )
    )
    took = time.monotonic() - started
    assert isinstance(long, ReplyOk), (long, fleet.logs())
    assert took > 3, f"the long batch took only {took:.1f}s: the test cannot tell anything"
    assert isinstance(short, ReplyError), f"computed after its deadline: {type(short).__name__}"
    assert short.error.code == "DEADLINE_EXCEEDED", short
