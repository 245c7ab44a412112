"""An idle keep-alive connection outlives the clients' own idle expiry (httpx: 5 s): a client
that reuses it after 6 s is answered on the same connection, instead of racing the server's
close (uvicorn's default 5 s reset requests under load). The real `taskfleet gateway` process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from serving.embedded_nats import free_port
from serving.httpserver import KEEP_ALIVE_S
from testbed.fleet import wait_until


def _get(sock: socket.socket, path: str) -> bytes:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: keep-alive\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return data  # closed by the server
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(4096)
    return head


def test_gateway_keeps_an_idle_connection_longer_than_clients_do(tmp_path: Path) -> None:
    assert KEEP_ALIVE_S > 5
    port = free_port()
    env = {**os.environ, "TASKFLEET_HOME": str(tmp_path)}
    # No NATS is needed for /healthz: the gateway answers it while it retries NATS.
    command = [sys.executable, "-m", "taskfleet", "gateway", "--no-auth", "--port", str(port)]
    command += ["--nats-url", f"nats://127.0.0.1:{free_port()}"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:

        def connected() -> socket.socket | None:
            try:
                return socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                return None

        sock = wait_until(connected, timeout_s=60, every_s=0.2)
        with sock:
            assert b" 200 " in _get(sock, "/healthz").split(b"\r\n")[0]
            time.sleep(6.0)  # longer than httpx's and uvicorn's default idle expiry
            again = _get(sock, "/healthz")
            assert again.startswith(b"HTTP/1.1 200"), again
    finally:
        proc.terminate()
        proc.wait(timeout=30)
