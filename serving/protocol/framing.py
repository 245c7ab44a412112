"""Frames of the socket protocol: a 4-byte big-endian unsigned length, then one msgpack map."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from serving.protocol.codec import pack, unpack
from serving.protocol.codes import FrameError, ProtocolError

DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
FRAME_HEADER = struct.Struct(">I")


def encode_frame(message: Any) -> bytes:
    body = pack(message)
    if len(body) > 0xFFFFFFFF:
        raise ValueError(f"message of {len(body)} bytes does not fit a frame")
    return FRAME_HEADER.pack(len(body)) + body


async def write_frame(writer: asyncio.StreamWriter, message: Any) -> None:
    writer.write(encode_frame(message))
    await writer.drain()


async def read_frame(
    reader: asyncio.StreamReader, max_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> dict[str, Any] | None:
    """Read one frame's map; ``None`` on a clean end of stream between frames.

    Raises :class:`FrameError` when the stream is broken (the connection cannot be trusted
    any more) and :class:`ProtocolError` when one frame's body is bad but the stream is intact.
    """
    try:
        header = await reader.readexactly(FRAME_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError(f"stream ended inside a frame header ({len(exc.partial)} bytes)") from exc
    (length,) = FRAME_HEADER.unpack(header)
    if length > max_bytes:
        raise FrameError(f"frame of {length} bytes exceeds the limit of {max_bytes} bytes")
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(f"stream ended after {len(exc.partial)} of {length} frame bytes") from exc
    obj = unpack(body)
    if not isinstance(obj, dict):
        raise ProtocolError(f"frame body must be a msgpack map, got {type(obj).__name__}")
    return obj
