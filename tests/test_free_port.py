"""`free_port` hands out a port no other process gets before our server binds it: test workers
run in parallel (pytest-xdist), each starting nats-servers, PostgreSQL and gateways on ports
it asked the OS for."""

from __future__ import annotations

import socket
from pathlib import Path

from serving.embedded_nats import EmbeddedNats, free_port


def test_a_free_port_is_held_back_from_other_callers_but_not_from_its_server() -> None:
    port = free_port()
    other = socket.socket()
    try:
        # What another process's free_port (or any bind to port 0) would need: refused.
        refused = other.connect_ex(("127.0.0.1", port)) != 0
        try:
            other.bind(("127.0.0.1", port))
            taken = False
        except OSError:
            taken = True
    finally:
        other.close()
    assert refused, "something listens on the port already"
    assert taken, "the port is free for anyone: a parallel worker may be handed it too"
    server = socket.socket()
    try:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))  # how nats-server, PostgreSQL, uvicorn, tokio bind
        server.listen(1)
    finally:
        server.close()


def test_a_nats_server_starts_on_a_held_back_port(tmp_path: Path) -> None:
    port = free_port()
    with EmbeddedNats(tmp_path / "nats", port=port) as server:
        assert server.port == port and server.running
