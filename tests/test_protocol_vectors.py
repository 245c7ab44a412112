"""Golden vectors: committed bytes equal the generator's output and survive decode -> encode."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import struct
from pathlib import Path
from types import ModuleType
from typing import Any

import msgpack
import numpy as np
import pytest

from serving import protocol as p

VECTORS = Path(__file__).resolve().parent / "vectors"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vectors_generate", VECTORS / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()
NAMES = sorted(GEN.messages())


def test_committed_files_equal_generator_output() -> None:
    rendered = GEN.render()
    on_disk = {f.name for f in VECTORS.iterdir() if f.suffix in (".msgpack", ".json")}
    assert on_disk == set(rendered), "stale or missing vector files; run tests/vectors/generate.py"
    for file_name, content in rendered.items():
        assert (VECTORS / file_name).read_bytes() == content, f"{file_name} differs from generator"


def test_readme_lists_every_vector() -> None:
    readme = (VECTORS / "README.md").read_text()
    for name in NAMES:
        assert f"| {name} |" in readme


@pytest.mark.parametrize("name", NAMES)
def test_vector_decodes_to_its_type_and_reencodes_identically(name: str) -> None:
    expected = GEN.messages()[name]
    data = (VECTORS / f"{name}.msgpack").read_bytes()
    decoded = p.from_wire(type(expected), p.unpack(data))
    assert decoded == expected
    assert p.pack(decoded) == data


@pytest.mark.parametrize("name", NAMES)
def test_json_twin_equals_msgpack(name: str) -> None:
    from_msgpack = p.unpack((VECTORS / f"{name}.msgpack").read_bytes())
    from_json = GEN.from_json_value(json.loads((VECTORS / f"{name}.json").read_text()))
    assert from_json == from_msgpack
    assert list(from_json) == list(from_msgpack), "key order differs"
    # Packing the JSON-derived map gives the same bytes: JSON alone suffices to rebuild a vector.
    assert msgpack.packb(from_json, use_bin_type=True) == (VECTORS / f"{name}.msgpack").read_bytes()


def test_socket_requests_dispatch_on_op() -> None:
    for name in NAMES:
        if name.startswith("socket_") and name.endswith("_request"):
            obj = p.unpack((VECTORS / f"{name}.msgpack").read_bytes())
            assert type(p.decode_request(obj)) is p.REQUEST_TYPES[obj["op"]]


def test_reply_decoding_tells_errors_from_results() -> None:
    err = p.unpack((VECTORS / "socket_error_reply.msgpack").read_bytes())
    assert isinstance(p.decode_reply("infer", err), p.ErrorReply)
    ok = p.unpack((VECTORS / "socket_infer_reply.msgpack").read_bytes())
    reply = p.decode_reply("infer", ok)
    assert isinstance(reply, p.InferReply)
    np.testing.assert_array_equal(reply.results[1].matrix(), GEN.EMBEDDINGS_2X3)


def test_embeddings_are_little_endian_float32_row_major() -> None:
    matrix = np.array([[1.0, -2.0], [0.5, 3.0], [0.0, 1.25]], dtype=np.float32)
    count, dims, data = p.embeddings_to_bytes(matrix)
    assert (count, dims) == (3, 2)
    assert data == struct.pack("<6f", 1.0, -2.0, 0.5, 3.0, 0.0, 1.25)
    np.testing.assert_array_equal(p.embeddings_from_bytes(data, 3, 2), matrix)
    with pytest.raises(p.ProtocolError):
        p.embeddings_from_bytes(data, 2, 2)


@pytest.mark.parametrize(
    ("obj", "code", "request_id"),
    [
        ({"op": "fly", "id": 4}, p.SocketErrorCode.UNKNOWN_OP, 4),
        ({"op": "unload"}, p.SocketErrorCode.BAD_REQUEST, None),
        ({"op": "unload", "id": 5}, p.SocketErrorCode.BAD_REQUEST, 5),
        ({"op": "unload", "id": 5, "model_key": 7}, p.SocketErrorCode.BAD_REQUEST, 5),
        ({"op": "unload", "id": 5, "model_key": "m", "extra": 1}, p.SocketErrorCode.BAD_REQUEST, 5),
        ({"op": "stats", "id": True}, p.SocketErrorCode.BAD_REQUEST, None),
        (
            {
                "op": "infer",
                "id": 6,
                "batch_id": "b",
                "items": [{"model_key": "m", "kind": "x", "texts": []}],
            },
            p.SocketErrorCode.BAD_REQUEST,
            6,
        ),
        ([1, 2], p.SocketErrorCode.BAD_REQUEST, None),
    ],
)
def test_bad_requests_raise_precise_errors(
    obj: Any, code: p.SocketErrorCode, request_id: int | None
) -> None:
    with pytest.raises(p.ProtocolError) as info:
        p.decode_request(obj)
    assert info.value.code == code
    assert info.value.request_id == request_id


def test_optional_field_may_be_absent_but_required_may_not() -> None:
    base = p.to_wire(GEN.messages()["socket_load_request"])
    del base["max_seq_length"]
    assert p.from_wire(p.LoadRequest, base).max_seq_length is None
    del base["model_key"]
    with pytest.raises(p.ProtocolError, match="missing field 'model_key'"):
        p.from_wire(p.LoadRequest, base)


def test_wrong_version_is_rejected() -> None:
    obj = p.to_wire(GEN.messages()["queue_payload"])
    obj["v"] = 2
    with pytest.raises(p.ProtocolError, match="v"):
        p.from_wire(p.QueuePayload, obj)


def _read_all(data: bytes, max_bytes: int = p.DEFAULT_MAX_FRAME_BYTES) -> list[Any]:
    async def run() -> list[Any]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        out: list[Any] = []
        while True:
            try:
                frame = await p.read_frame(reader, max_bytes)
            except p.FrameError as exc:
                out.append(exc)
                return out
            except p.ProtocolError as exc:
                out.append(exc)
                continue
            if frame is None:
                return out
            out.append(frame)

    return asyncio.run(run())


def test_frames_round_trip_and_bad_frames_are_reported() -> None:
    hello = GEN.messages()["socket_hello_request"]
    good = p.encode_frame(hello)
    assert good[:4] == struct.pack(">I", len(good) - 4)
    garbage = b"\xc1\xc1"  # 0xc1 is never valid msgpack
    not_a_map = msgpack.packb([1, 2])
    stream = (
        good
        + struct.pack(">I", len(garbage))
        + garbage
        + struct.pack(">I", len(not_a_map))
        + not_a_map
        + good
    )
    out = _read_all(stream)
    assert out[0] == p.to_wire(hello)
    assert isinstance(out[1], p.ProtocolError) and not isinstance(out[1], p.FrameError)
    assert isinstance(out[2], p.ProtocolError) and "map" in str(out[2])
    assert out[3] == p.to_wire(hello)
    assert len(out) == 4


def test_oversized_and_truncated_frames_break_the_stream() -> None:
    [too_big] = _read_all(struct.pack(">I", 1000) + b"x" * 1000, max_bytes=100)
    assert isinstance(too_big, p.FrameError) and "exceeds" in str(too_big)
    [cut] = _read_all(struct.pack(">I", 10) + b"abc")
    assert isinstance(cut, p.FrameError) and "3 of 10" in str(cut)
    [cut_header] = _read_all(b"\x00\x00")
    assert isinstance(cut_header, p.FrameError)
