"""The sidecar binary on its own, before any runtime or gateway: it beats into KV `workers`
with the settings it was given and deletes its heartbeat when SIGTERM stops it; without a
runtime setting it says which flag is missing. (The NATS-facing parts inside it, heartbeat,
placement watcher and layout, are the crate's own tests: `cargo test`.)"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import nats

from serving import nats_layout
from serving.embedded_nats import EmbeddedNats
from serving.fleet_watcher import decode_heartbeat
from taskfleet.stack import find_sidecar_binary


def _environment(**extra: str) -> dict[str, str]:
    """This process's environment without the worker settings a developer may have exported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKFLEET_")}
    return env | extra


def _heartbeats(url: str) -> dict[str, bytes]:
    async def read() -> dict[str, bytes]:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            try:
                return await nats_layout.kv_values(js, "workers")
            except nats.js.errors.NotFoundError:  # the bucket is not there yet
                return {}
        finally:
            await nc.close()

    return asyncio.run(read())


def test_beats_without_a_runtime_and_stops_on_sigterm(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    worker = f"w-bin-{uuid.uuid4().hex[:8]}"
    args = ["--worker-id", worker, "--heartbeat-ms", "100"]
    args += ["--runtime-socket", str(tmp_path / "absent.sock")]
    sidecar = subprocess.Popen(
        [str(find_sidecar_binary()), *args],
        env=_environment(TASKFLEET_NATS_URL=nats_server.url, TASKFLEET_MEMORY_BUDGET_BYTES="777"),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while (value := _heartbeats(nats_server.url).get(worker)) is None:
            assert sidecar.poll() is None, sidecar.communicate()[1].decode()
            assert time.monotonic() < deadline, "no heartbeat from the binary"
            time.sleep(0.1)
        beat = decode_heartbeat(value)
        assert beat.worker_id == worker
        assert beat.memory_budget == 777, "the flag's environment fallback is used"

        sidecar.send_signal(signal.SIGTERM)
        _, stderr = sidecar.communicate(timeout=20)
        assert sidecar.returncode == 0, stderr.decode()
        assert worker not in _heartbeats(nats_server.url), "a clean stop deletes the heartbeat"
    finally:
        if sidecar.poll() is None:
            sidecar.kill()
            sidecar.wait()


def test_without_a_runtime_setting_it_explains_itself() -> None:
    done = subprocess.run(
        [str(find_sidecar_binary())], env=_environment(), capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert "--runtime-cmd" in done.stderr, done.stderr
