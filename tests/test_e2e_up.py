"""`taskfleet up` as a user runs it: one command starts the fleet, a `taskfleet promote` is
published through it, a call by task name works, and SIGTERM leaves no process behind."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from registry import Registry
from serving.client import Client
from testbed.declared_tasks import add_task
from testbed.fleet import COLD_START_S, HTTP_TIMEOUT_S, free_port, unique_task, wait_until

REPO = Path(__file__).resolve().parent.parent


def _cli(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "taskfleet", "--home", str(home), *args],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TASKFLEET_NATS_URL"}
    return {**env, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children of children too), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry.name)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _seed(home: Path, task: str, model: Path, *, promote: bool = False) -> None:
    """A registry under ``home`` with ``task`` and a candidate on the model ``tiny``."""
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    add_task(reg, task, suite="s")
    reg.add_model("tiny", path=model)
    candidate = reg.add_candidate(task, base="tiny").name
    if promote:
        reg.promote(task, candidate, override=True, reason="test: no eval run", pinned=True)
    reg.close()


def _launch_up(
    home: Path, log: IO[bytes], *args: str, workers: int = 1
) -> tuple[subprocess.Popen[bytes], int, int]:
    """`taskfleet up --workers 1 --no-auth` on free ports; returns it and its two ports."""
    port, control_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "taskfleet", "--home", str(home), "up", "--workers", str(workers),
         "--no-auth", "--port", str(port), "--control-port", str(control_port), *args],
        cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    return proc, port, control_port


def _stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        for pid in _descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        return proc.wait()


def _healthz(control_port: int) -> httpx.Response:
    """The control plane's /healthz on loopback."""
    return httpx.get(f"http://127.0.0.1:{control_port}/healthz", timeout=HTTP_TIMEOUT_S)


def test_no_reevaluate_leaves_an_unevaluated_champion_to_serve_alone(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    """A champion placed by override has no evidence, so the leader's production loop queues
    its evaluation and runs it beside the serving (default). `--no-reevaluate` (what `taskfleet
    tune` and the benchmarks start) queues and runs none: nothing shares the CPU with what they
    measure."""
    home = tmp_path / "home"
    task = unique_task("noreeval")
    _seed(home, task, tiny_model_path, promote=True)
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")

    def leading(control_port: int) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return bool(_healthz(control_port).json().get("publisher") == "leader")
        return False

    try:
        with (tmp_path / "quiet.log").open("wb") as log:
            proc, _, control_port = _launch_up(home, log, "--no-reevaluate", workers=0)
            try:
                wait_until(lambda: leading(control_port), timeout_s=COLD_START_S)
                time.sleep(5 * 2.0)  # five production ticks (taskfleet/production.py TICK_S)
                assert reg.list_reevaluations(task) == []
                assert proc.poll() is None, (tmp_path / "quiet.log").read_text()[-2000:]
            finally:
                _stop(proc)
        with (tmp_path / "default.log").open("wb") as log:
            proc, _, control_port = _launch_up(home, log, workers=0)
            try:
                queued = wait_until(lambda: reg.list_reevaluations(task), timeout_s=COLD_START_S)
                assert queued[0].candidate == "tiny" and "no eval run" in queued[0].reason
            finally:
                _stop(proc)
    finally:
        reg.close()


def test_up_serves_publishes_and_stops_cleanly(tmp_path: Path, tiny_model_path: Path) -> None:
    home = tmp_path / "home"
    task = unique_task("up")
    _seed(home, task, tiny_model_path)
    log = (tmp_path / "up.log").open("wb")
    proc, port, control_port = _launch_up(home, log)
    try:
        gateway = f"http://127.0.0.1:{port}"
        wait_until(lambda: (home / "run" / "stack.json").is_file(), timeout_s=COLD_START_S)
        state = json.loads((home / "run" / "stack.json").read_text())
        assert state["gateway"] == gateway
        assert _healthz(control_port).status_code == 200
        # `up` says it is ready once its worker's runtime is: a first request waits for its
        # model, not for the runtime's imports (the gateway's metrics come first).
        for url in state["metrics"][1:]:
            text = httpx.get(url, timeout=HTTP_TIMEOUT_S).text
            assert re.search(r"^taskfleet_sidecar_runtime_up 1$", text, flags=re.M), text

        # No eval run here: a local admin places the first champion by override, pinned; the
        # publisher that `up` runs publishes it.
        placed = _cli(home, "promote", task, "tiny", "--override", "--reason", "smoke", "--pinned")
        assert placed.returncode == 0, placed.stderr
        assert "placement epoch 1" in placed.stdout

        # The worker's runtime starts cold (torch, then the model): the request goes once the
        # placement is reported served.
        status = _converged(home)
        with Client(gateway, max_retries=40) as client:
            vectors = client.embed(task, ["hallo welt", "zweiter satz"])
        assert vectors.shape == (2, 32)
        assert status["task"] == task and status["pinned"] and status["desired_epoch"] == 1
        assert list(status["reported"].values()) == [1]
        table = _cli(home, "placement", "ls").stdout  # the human view renders too
        assert "desired" in table and "worker" in table
        children = _descendants(proc.pid)
        assert len(children) >= 3, "nats-server, a sidecar and its runtime should be running"
    finally:
        children = _descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            pytest.fail("taskfleet up did not stop within 40 s of SIGTERM")
        log.close()
    assert code == 0, (tmp_path / "up.log").read_text()[-3000:]
    time.sleep(0.5)
    orphans = [pid for pid in children if _alive(pid)]
    assert not orphans, f"processes left behind: {orphans}"
    assert not (home / "run" / "stack.json").exists()


def _converged(home: Path) -> dict[str, Any]:
    """The first placement every worker reports at its desired epoch (`placement ls`), once
    there is one: a cold start's wait."""

    def converged() -> dict[str, Any]:
        fleet = json.loads(_cli(home, "placement", "ls", "--json").stdout)
        return next((p for p in fleet["placements"] if p["converged"]), {})

    return wait_until(converged, timeout_s=COLD_START_S, every_s=0.5)


def _nats_server_pid(root: int) -> int | None:
    for pid in _descendants(root):
        try:
            if Path(f"/proc/{pid}/exe").resolve().name == "nats-server" and _alive(pid):
                return pid
        except OSError:
            continue
    return None


def test_up_restarts_nats_server_after_it_dies(tmp_path: Path, tiny_model_path: Path) -> None:
    """Every child `up` starts is supervised: nats-server killed, the stack serves again
    without anyone doing anything."""
    home = tmp_path / "home"
    task = unique_task("upnats")
    _seed(home, task, tiny_model_path, promote=True)
    log = (tmp_path / "up.log").open("wb")
    proc, port, _ = _launch_up(home, log)
    try:
        gateway = f"http://127.0.0.1:{port}"
        wait_until(lambda: (home / "run" / "stack.json").is_file(), timeout_s=COLD_START_S)
        _converged(home)
        with Client(gateway, max_retries=60) as client:
            assert client.embed(task, "vorher").shape == (1, 32)
            first = wait_until(lambda: _nats_server_pid(proc.pid), timeout_s=5)
            os.kill(first, signal.SIGKILL)
            second = wait_until(
                lambda: (p := _nats_server_pid(proc.pid)) is not None and p != first and p,
                timeout_s=30,
            )
            assert second != first
            assert client.embed(task, "nachher", timeout_ms=20_000).shape == (1, 32)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_up_with_a_three_node_nats_cluster(tmp_path: Path) -> None:
    """`taskfleet up --nats-cluster 3`: three clustered nats-servers (one store dir each), the
    layout at R3, every role on the URL list; SIGTERM stops all three."""
    import asyncio

    import nats

    home = tmp_path / "home"
    log = (tmp_path / "up.log").open("wb")
    port, control_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "taskfleet", "--home", str(home), "up", "--workers", "0",
         "--no-auth", "--nats-cluster", "3", "--port", str(port),
         "--control-port", str(control_port)],
        cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        stack = home / "run" / "stack.json"
        wait_until(stack.is_file, timeout_s=90)
        urls = json.loads(stack.read_text())["nats"].split(",")
        assert len(urls) == 3
        assert sorted(p.name for p in (home / "nats-cluster").iterdir()) == ["n0", "n1", "n2"]

        async def replicas() -> int | None:
            nc = await nats.connect(servers=urls)
            try:
                return (await nc.jetstream().stream_info("KV_placements")).config.num_replicas
            finally:
                await nc.close()

        assert asyncio.run(replicas()) == 3
        health = _healthz(control_port).json()
        wait_until(lambda: _healthz(control_port).json()["publisher"] == "leader", timeout_s=30)
        assert health["nats"] == ",".join(urls)
        servers = [p for p in _descendants(proc.pid) if _exe(p) == "nats-server"]
        assert len(servers) == 3
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        log.close()
    assert code == 0, (tmp_path / "up.log").read_text()[-3000:]
    assert not [p for p in servers if _alive(p)]


def _exe(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/exe").resolve().name
    except OSError:
        return ""
