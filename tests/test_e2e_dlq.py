"""Dead letters end to end: a request whose model cannot load (the object store holds bytes
that do not hash to the placement's weights) is retried, dead-lettered by the real sidecar with
its error, listed by `taskfleet dlq ls`, and once the right bytes are back, `taskfleet dlq
replay` runs it successfully and removes it from the DLQ."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest

from serving.artifact_source import build_manifest, file_object
from serving.client import Client, TaskfleetError
from serving.nats_layout import ensure_layout
from testbed.fleet import LocalFleet, register_served_task, unique_task, wait_until

REPO = Path(__file__).resolve().parent.parent


def _cli(home: Path, nats_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TASKFLEET_NATS_URL": nats_url, "PYTHONPATH": str(REPO), "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "taskfleet", "--home", str(home), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip


def _put_file(url: str, name: str, data: bytes) -> None:
    async def put() -> None:
        nc = await nats.connect(url)
        try:
            await (await ensure_layout(nc.jetstream())).artifacts.put(name, data)
        finally:
            await nc.close()

    asyncio.run(put())


def test_dead_letter_listed_then_replayed(tmp_path: Path, tiny_model_path: Path) -> None:
    model_dir = shutil.copytree(tiny_model_path, tmp_path / "model")
    fleet = LocalFleet(tmp_path / "fleet", workers=1).start()
    home = tmp_path / "home"
    try:
        assert fleet.nats is not None
        url = fleet.nats.url
        task = unique_task("dlq")
        register_served_task(fleet.reg, task, model_dir)  # lazy: loads on first request
        worker = fleet.sidecars[0].worker_id
        wait_until(lambda: task in getattr(fleet.heartbeats().get(worker), "queue_depth", {}))
        # The weights go bad in the object store after the placement reached the worker,
        # before any load (lazy): the worker refuses them.
        sha = fleet.reg.get_model(f"m-{task}").sha256
        weights = max(build_manifest(model_dir, sha).files, key=lambda f: f.size)
        _put_file(url, file_object(weights.sha256), b"\0" * weights.size)

        with (
            Client(fleet.gateway_url, max_retries=20) as client,
            pytest.raises(TaskfleetError) as failed,
        ):
            client.embed(task, "eine frage", timeout_ms=20_000)
        assert failed.value.code == "LOAD_FAILED", failed.value

        listing = _cli(home, url, "dlq", "ls", "--task", task)
        assert listing.returncode == 0, listing.stderr
        assert "LOAD_FAILED" in listing.stdout and "1 query text(s)" in listing.stdout
        seq = re.search(r"│\s*(\d+)\s*│", listing.stdout)
        assert seq, listing.stdout

        _put_file(url, file_object(weights.sha256), (model_dir / weights.path).read_bytes())
        time.sleep(5.5)  # the sidecar retries a failed load at most every 5 s
        replayed = _cli(home, url, "dlq", "replay", seq.group(1), "--wait", "40")
        assert replayed.returncode == 0, replayed.stderr
        assert re.search(r": ok \(1 x 32, m-" + task, replayed.stdout), replayed.stdout
        assert "the DLQ is empty" in _cli(home, url, "dlq", "ls", "--task", task).stdout

        bad = _cli(home, url, "dlq", "replay", "999999")
        assert bad.returncode == 1 and "no dead letter #999999" in bad.stderr
        assert "Traceback" not in bad.stderr
    except AssertionError:
        print(fleet.logs())
        raise
    finally:
        fleet.stop()
