"""Bad input by machine: hypothesis feeds the serving decoders what no test author would type.

Each decoder either returns a well-typed value or raises its one documented error - never
anything else (an unexpected exception is a 500 at the gateway or a dead runtime connection):

- public request bodies (msgpack and JSON, task route and OpenAI route) -> ``BadRequest``;
- socket frames and messages (frame reader, request dispatch, every wire type) ->
  ``ProtocolError`` / ``FrameError``;
- KV values (worker heartbeats) -> ``ProtocolError``;
- and over real HTTP, a live gateway answers any body with the error shape or a correct
  answer, never a 500.

``HYPOTHESIS_PROFILE=bench`` (``make bench``) runs many more examples; every test counts its
examples into ``TASKFLEET_HYPOTHESIS_COUNTS`` (a JSON file) when that variable is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving import protocol as p
from serving.fleet_watcher import decode_heartbeat
from serving.gateway import GatewaySettings
from serving.gateway.bodies import (
    EmbedBody,
    Format,
    decode_map,
    parse_embed_body,
    parse_openai_request,
)
from serving.gateway.errors import BadRequest
from tests.gateway_fixture import Responder, Stack, expected_embedding, nats_and_gateway

EXAMPLES: Counter[str] = Counter()

# Any code point, with lone surrogates often: hypothesis leaves them out unless asked, and
# draws them rarely even then (2048 of 1.1 million code points), so some are mixed in by hand.
SURROGATES = ["\ud800", "\udbff", "\udc00", "\udfff", "\ud83d"]
any_text = st.lists(
    st.characters(exclude_categories=()) | st.sampled_from(SURROGATES), max_size=12
).map("".join)
# Integers within msgpack's 64-bit range.
numbers = st.integers(-(2**63), 2**64 - 1) | st.floats()
scalars = st.none() | st.booleans() | numbers | any_text | st.binary(max_size=8)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12,
)
# Request-shaped maps: the right keys with any values, and often the right shape with nasty
# text (non-empty lists of non-empty strings), so the checks past the shape are reached too.
texts = st.lists(any_text.filter(bool), min_size=1, max_size=5)
task_bodies = st.fixed_dictionaries(
    {"inputs": st.one_of(texts, values, st.lists(any_text, max_size=5), any_text)},
    optional={"kind": st.one_of(st.sampled_from(["query", "passage"]), values)},
)
openai_bodies = st.fixed_dictionaries(
    {"model": st.one_of(any_text, values), "input": st.one_of(texts, values)},
    optional={
        "encoding_format": st.one_of(values, st.sampled_from(["float", "base64"])),
        "dimensions": values,
        "kind": values,
    },
)


@pytest.fixture(scope="module", autouse=True)
def _write_counts() -> Iterator[None]:
    yield
    target = os.environ.get("TASKFLEET_HYPOTHESIS_COUNTS")
    if target:
        path = Path(target)
        previous = json.loads(path.read_text()) if path.is_file() else {}
        previous.update(EXAMPLES)
        path.write_text(json.dumps(previous, indent=2, sort_keys=True))


def as_json(obj: Any) -> bytes:
    """JSON with \\u escapes (so lone surrogates survive), bytes written as lists of ints."""
    return json.dumps(obj, default=list, ensure_ascii=True).encode()


def as_msgpack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, unicode_errors="surrogatepass")


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_task_request(body: bytes, fmt: Format) -> EmbedBody:
    """What the gateway parses for a retrieval task's `POST /v1/tasks/{task}`."""
    return parse_embed_body(decode_map(body, fmt), max_inputs=2048)


def check_task_body(body: bytes, fmt: Format) -> None:
    try:
        parsed = parse_task_request(body, fmt)
    except BadRequest:
        return
    assert parsed.inputs and all(isinstance(t, str) and t for t in parsed.inputs)
    assert all(encodable(t) for t in parsed.inputs), "text that cannot be queued passed"
    assert parsed.kind in ("query", "passage")
    p.pack(p.QueuePayload(task="t", kind=parsed.kind, inputs=parsed.inputs))


@given(st.one_of(task_bodies, values))
def test_task_bodies_decode_or_are_400(obj: Any) -> None:
    EXAMPLES["gateway task body (JSON + msgpack)"] += 1
    check_task_body(as_json(obj), Format.JSON)
    check_task_body(as_msgpack(obj), Format.MSGPACK)


@given(st.binary(max_size=256))
def test_task_bodies_of_random_bytes_are_400(data: bytes) -> None:
    EXAMPLES["gateway task body (random bytes)"] += 1
    check_task_body(data, Format.JSON)
    check_task_body(data, Format.MSGPACK)


@given(st.one_of(openai_bodies, values))
def test_openai_bodies_decode_or_are_400(obj: Any) -> None:
    EXAMPLES["gateway OpenAI body"] += 1
    try:
        parsed = parse_openai_request(as_json(obj), max_inputs=2048)
    except BadRequest:
        return
    assert encodable(parsed.task) and all(encodable(t) for t in parsed.request.inputs)
    assert parsed.encoding_format in ("float", "base64")


# ---- the wire protocol: frames, socket requests, queue messages, KV values ----------------

wire_types = [
    p.QueuePayload,
    p.ReplyOk,
    p.ReplyError,
    p.WorkerHeartbeat,
    p.PlacementValue,
    p.InferReply,
    p.StatsReply,
]


@given(values)
def test_wire_messages_decode_or_raise_protocol_error(obj: Any) -> None:
    EXAMPLES["wire message (every type)"] += 1
    for cls in wire_types:
        with contextlib.suppress(p.ProtocolError):
            p.from_wire(cls, obj)
    with contextlib.suppress(p.ProtocolError):
        p.decode_request(obj)


@given(
    st.fixed_dictionaries(
        {"op": st.one_of(st.sampled_from(sorted(p.REQUEST_TYPES)), values), "id": values},
        optional={k: values for k in ("batch_id", "items", "model_key", "deadline_ms")},
    )
)
def test_socket_requests_decode_or_raise_protocol_error(obj: Any) -> None:
    EXAMPLES["socket request"] += 1
    try:
        request = p.decode_request(obj)
    except p.ProtocolError:
        return
    assert request.op == obj["op"]


@given(st.binary(max_size=512))
def test_kv_values_and_packed_bytes_decode_or_raise_protocol_error(data: bytes) -> None:
    EXAMPLES["KV value / msgpack bytes"] += 1
    # (KV placements are the control plane's: tests/test_properties.py covers them.)
    for decode in (decode_heartbeat, p.unpack):
        with contextlib.suppress(p.ProtocolError):
            decode(data)


@given(st.binary(max_size=512), st.lists(st.binary(max_size=64), max_size=4))
def test_socket_frames_read_or_raise_frame_errors(noise: bytes, bodies: list[bytes]) -> None:
    EXAMPLES["socket frame stream"] += 1
    stream = noise + b"".join(len(b).to_bytes(4, "big") + b for b in bodies)

    async def read_all() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(stream)
        reader.feed_eof()
        while True:
            try:
                frame = await p.read_frame(reader, max_bytes=1024)
            except p.FrameError:
                return  # the stream is broken: the connection ends
            except p.ProtocolError:
                continue  # one bad body: the stream goes on
            if frame is None:
                return
            assert isinstance(frame, dict)

    asyncio.run(read_all())


# ---- a live gateway over HTTP --------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = GatewaySettings(require_auth=False, default_timeout_s=10, workers_refresh_s=0.5)
    with nats_and_gateway(tmp_path_factory, settings) as built:
        yield built


@pytest.fixture(scope="module")
def answered_task(live: Stack) -> Iterator[str]:
    task = live.task()
    peer: Responder = live.responder(task)
    try:
        yield task
    finally:
        live.loop.run(peer.stop())


@given(st.one_of(task_bodies, values), st.sampled_from(["json", "msgpack"]))
def test_live_gateway_never_answers_500(
    live: Stack, answered_task: str, http: httpx.Client, obj: Any, fmt: str
) -> None:
    EXAMPLES["live gateway body over HTTP"] += 1
    body = as_json(obj) if fmt == "json" else as_msgpack(obj)
    media = f"application/{fmt}"
    response = http.post(
        f"{live.url}/v1/tasks/{answered_task}", content=body, headers={"Content-Type": media}
    )
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert response.json()["error"]["code"] == "BAD_REQUEST"
        return
    parsed = parse_task_request(body, Format(media))
    answer = json.loads(response.content) if fmt == "json" else msgpack.unpackb(response.content)
    assert answer["count"] == len(parsed.inputs)
    if fmt == "json":
        assert answer["embeddings"][0] == expected_embedding(parsed.inputs[0], parsed.kind)


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as client:
        yield client
