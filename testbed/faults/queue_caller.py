"""A caller that puts requests straight onto a task's queue, as a gateway does, and reads the
worker's own replies.

It sets the headers of docs/protocol.md ("Queue messages") itself, so a test can name the
caller's API key (``Tf-Key``) on a fleet whose gateway runs without auth, or stamp any
minimum epoch, and times each request from its publish to its worker's reply. Replies whose
float32 data went to the object store are read from there (and deleted), as the gateway does.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import nats
from nats.js.object_store import ObjectStore

from contract import HEADERS
from serving import nats_layout
from serving.protocol import (
    AnyReplyOk,
    ClassifyPayload,
    PayloadRef,
    QueuePayload,
    ReplyError,
    ScorePayload,
    decode_reply_message,
    offloaded_data,
    pack,
    unpack,
)

Inputs = list[str] | PayloadRef
#: Inputs above this go to the object store, as the gateway's inline limit says.
INLINE_LIMIT_BYTES = 1_000_000


@dataclass
class Answer:
    """One request's reply and how long it took, publish to reply."""

    reply: AnyReplyOk | ReplyError | None  # None: no reply before the wait ended
    seconds: float
    started: float  # time.monotonic() at publish
    key: str | None

    @property
    def ended(self) -> float:
        return self.started + self.seconds


class QueueCaller:
    """``async with QueueCaller(nats_url) as caller: await caller.embed(task, texts, key=...)``."""

    def __init__(self, nats_url: str) -> None:
        self.nats_url = nats_url
        self.prefix = f"_tf.test.{uuid.uuid4().hex[:8]}."
        self._waiting: dict[str, asyncio.Future[Any]] = {}
        self._nc: Any = None
        self._payloads: ObjectStore | None = None

    async def __aenter__(self) -> QueueCaller:
        self._nc = await nats.connect(self.nats_url)
        await self._nc.subscribe(self.prefix + ">", cb=self._on_reply)
        self._payloads = await self._nc.jetstream().object_store(nats_layout.PAYLOADS_BUCKET)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._nc.close()

    async def _on_reply(self, msg: Any) -> None:
        await msg.respond(b"")  # confirm, as a gateway does
        reply = decode_reply_message(unpack(msg.data))
        ref = offloaded_data(reply)
        if ref is not None and self._payloads is not None:
            data = (await self._payloads.get(ref.ref)).data or b""
            await self._payloads.delete(ref.ref)
            assert not isinstance(reply, ReplyError)
            reply = reply.with_data(data)
        future = self._waiting.get(reply.request_id)
        if future is not None and not future.done():
            future.set_result(reply)

    async def embed(
        self, task: str, texts: list[str], *, kind: str = "query", **headers: Any
    ) -> Answer:
        def payload(inputs: Inputs) -> Any:
            return QueuePayload(task=task, kind=kind, inputs=inputs)  # type: ignore[arg-type]

        return await self.send(task, payload, texts, **headers)

    async def rerank(self, task: str, query: str, documents: list[str], **headers: Any) -> Answer:
        def payload(inputs: Inputs) -> Any:
            return ScorePayload(task=task, query=query, documents=inputs)

        return await self.send(task, payload, documents, **headers)

    async def classify(self, task: str, texts: list[str], **headers: Any) -> Answer:
        def payload(inputs: Inputs) -> Any:
            return ClassifyPayload(task=task, inputs=inputs)

        return await self.send(task, payload, texts, **headers)

    async def send(
        self,
        task: str,
        payload: Callable[[Inputs], Any],
        texts: list[str],
        *,
        key: str | None = None,
        timeout_ms: int = 60_000,
        min_epoch: int | None = None,
    ) -> Answer:
        """Publish one request (its texts in the object store when above ~1 MB, as the
        gateway puts them) and wait for its reply until its deadline (and 5 s more)."""
        request_id = uuid.uuid4().hex
        headers = {
            HEADERS.msg_id: request_id,
            HEADERS.request_id: request_id,
            HEADERS.reply: self.prefix + request_id,
            HEADERS.deadline: str(int(time.time() * 1000) + timeout_ms),
        }
        if key is not None:
            headers[HEADERS.key] = key
        if min_epoch is not None:
            headers[HEADERS.min_epoch] = str(min_epoch)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        started = time.monotonic()
        try:
            inputs: Inputs = texts
            packed = msgpack.packb(texts, use_bin_type=True)
            if len(packed) > INLINE_LIMIT_BYTES:
                assert self._payloads is not None
                await self._payloads.put(request_id, packed)
                inputs = PayloadRef(ref=request_id)
            await self._nc.jetstream().publish(
                nats_layout.task_subject(task), pack(payload(inputs)), headers=headers
            )
            try:
                reply = await asyncio.wait_for(future, timeout=timeout_ms / 1000 + 5)
            except TimeoutError:
                reply = None
        finally:
            self._waiting.pop(request_id, None)
        return Answer(reply, time.monotonic() - started, started, key)
