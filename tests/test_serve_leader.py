"""`taskfleet serve` on its own host publishes, and several of them elect one leader.

Real processes (`python -m taskfleet serve`), a real nats-server and one SQLite registry: a
promotion through the REST API reaches KV `placements` with no `taskfleet up` anywhere; of two
control planes exactly one leads (the KV lock), and when it is killed with SIGKILL the other
publishes within the lock's TTL; with NATS down at start the dashboard serves and the control
plane says that publishing waits for NATS, then publishes once NATS is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import nats
import pytest

from registry import Registry
from serving.embedded_nats import EmbeddedNats, free_port
from serving.leader import LEADER_KEY, LeaderRecord
from serving.nats_layout import LEADER_BUCKET, LEADER_TTL_S, PLACEMENTS_BUCKET, ensure_layout
from serving.publisher import decode_placement
from testbed.declared_tasks import add_task
from testbed.fleet import unique_task, wait_until
from tests.nats_fixture import running_nats

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Serve:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    log: IO[bytes]

    def health(self) -> dict[str, str]:
        with contextlib.suppress(httpx.HTTPError):
            response = httpx.get(f"{self.url}/healthz", timeout=5)
            if response.status_code == 200:
                body: dict[str, str] = response.json()
                return body
        return {}

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TASKFLEET_NATS_URL"}
    return {**env, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}


@contextlib.contextmanager
def serving(home: Path, nats_url: str, name: str) -> Iterator[Serve]:
    port = free_port()
    log_path = home.parent / f"serve-{name}.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "taskfleet", "--home", str(home), "serve",
         "--port", str(port), "--nats-url", nats_url],
        cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    served = Serve(proc, f"http://127.0.0.1:{port}", log_path, log)
    try:
        wait_until(lambda: served.health() or proc.poll() is not None, timeout_s=60)
        assert proc.poll() is None, served.output()[-3000:]
        yield served
    finally:
        served.stop()


def _seed(home: Path, tmp: Path, task: str) -> str:
    """A registry under ``home`` with ``task``, one candidate, and an admin key (returned)."""
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    folder = tmp / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text('{"hidden_size": 4}')
    add_task(reg, task, suite="s")
    reg.add_model("m", path=folder)
    reg.add_candidate(task, base="m")
    _, token = reg.create_api_key("lead", roles=["admin"])
    reg.close()
    return token


def _promote(serve: Serve, token: str, task: str) -> int:
    response = httpx.post(
        f"{serve.url}/api/v1/tasks/{task}/promote",
        json={"candidate": "m", "override": True, "reason": "test: no eval run"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    epoch: int = response.json()["epoch"]
    return epoch


async def _kv_value(nats_url: str, bucket: str, key: str) -> bytes | None:
    """The value under ``key`` in KV ``bucket``, read straight from NATS; None when absent."""
    nc = await nats.connect(nats_url, connect_timeout=2, max_reconnect_attempts=1)
    try:
        await ensure_layout(nc.jetstream())
        kv = await nc.jetstream().key_value(bucket)
        try:
            return (await kv.get(key)).value or b""
        except nats.js.errors.NotFoundError:
            return None
    finally:
        await nc.close()


def _kv_epoch(nats_url: str, task: str) -> int | None:
    value = asyncio.run(_kv_value(nats_url, PLACEMENTS_BUCKET, task))
    return None if value is None else decode_placement(value).epoch


def _lock_holder(nats_url: str) -> str | None:
    record = LeaderRecord.unpack(asyncio.run(_kv_value(nats_url, LEADER_BUCKET, LEADER_KEY)))
    return record.holder if record else None


def _published(nats_url: str, task: str, epoch: int) -> bool:
    return (_kv_epoch(nats_url, task) or 0) >= epoch


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    with running_nats(tmp_path / "nats") as server:
        yield server


def test_serve_alone_publishes_a_rest_promotion(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    home, task = tmp_path / "home", unique_task("serve")
    token = _seed(home, tmp_path, task)
    with serving(home, nats_server.url, "alone") as serve:
        wait_until(lambda: serve.health().get("publisher") == "leader", timeout_s=30)
        epoch = _promote(serve, token, task)
        wait_until(lambda: _published(nats_server.url, task, epoch), timeout_s=15)
        assert "leading" in serve.output()


def test_two_serves_one_leads_and_the_other_takes_over_after_kill9(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    home, task = tmp_path / "home", unique_task("lead")
    token = _seed(home, tmp_path, task)
    with (
        serving(home, nats_server.url, "a") as first,
        serving(home, nats_server.url, "b") as second,
    ):
        both = (first, second)

        def roles() -> list[str] | None:
            seen = sorted(s.health().get("publisher", "") for s in both)
            return seen if seen == ["leader", "standby"] else None

        wait_until(roles, timeout_s=30)
        leader = next(s for s in both if s.health()["publisher"] == "leader")
        standby = second if leader is first else first
        holder = _lock_holder(nats_server.url)
        assert holder == leader.health()["holder"]
        assert standby.health()["leader"] == holder  # the standby names who leads
        # Both stay as they are: nobody steals a lock that is renewed.
        time.sleep(LEADER_TTL_S / 2)
        assert roles() == ["leader", "standby"]

        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait()
        killed = time.monotonic()
        epoch = _promote(standby, token, task)  # the survivor's REST API works meanwhile
        wait_until(lambda: _published(nats_server.url, task, epoch), timeout_s=LEADER_TTL_S + 20)
        took = time.monotonic() - killed
        assert standby.health()["publisher"] == "leader"
        # The lock expires one TTL after the last renewal; the standby retries every second.
        assert took < LEADER_TTL_S + 3, f"published {took:.1f}s after the leader was killed"
        print(f"takeover: published {took:.1f}s after SIGKILL of the leader (TTL {LEADER_TTL_S}s)")


def test_a_clean_stop_hands_the_lead_over_at_once(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    home, task = tmp_path / "home", unique_task("handover")
    token = _seed(home, tmp_path, task)
    with serving(home, nats_server.url, "a") as first:
        wait_until(lambda: first.health().get("publisher") == "leader", timeout_s=30)
        with serving(home, nats_server.url, "b") as second:
            wait_until(lambda: second.health().get("publisher") == "standby", timeout_s=30)
            first.stop()  # SIGTERM: releases the lock
            stopped = time.monotonic()
            wait_until(lambda: second.health().get("publisher") == "leader", timeout_s=15)
            assert time.monotonic() - stopped < LEADER_TTL_S / 2
            epoch = _promote(second, token, task)
            wait_until(lambda: _published(nats_server.url, task, epoch), timeout_s=15)


def test_serve_with_nats_down_serves_the_dashboard_and_publishes_once_nats_is_up(
    tmp_path: Path,
) -> None:
    home, task = tmp_path / "home", unique_task("down")
    token = _seed(home, tmp_path, task)
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    with serving(home, url, "down") as serve:
        wait_until(lambda: "waits for it" in serve.output(), timeout_s=30)
        assert serve.health()["publisher"] == "waiting for NATS"
        login = httpx.get(f"{serve.url}/login", timeout=10)
        assert login.status_code == 200 and "Publishing to the fleet waits for NATS" in login.text
        epoch = _promote(serve, token, task)  # recorded; published once NATS is up
        server = EmbeddedNats(tmp_path / "late-nats", port=port).start()
        try:
            wait_until(lambda: _published(url, task, epoch), timeout_s=30)
            assert serve.health()["publisher"] == "leader"
            assert "waits for NATS" not in httpx.get(f"{serve.url}/login", timeout=10).text
        finally:
            server.stop()


def test_the_lock_is_taken_once_renewed_by_its_holder_and_handed_on(
    nats_server: EmbeddedNats,
) -> None:
    from serving.leader import LeaderLock

    async def scenario() -> None:
        nc = await nats.connect(nats_server.url)
        try:
            kv = (await ensure_layout(nc.jetstream())).leader
            first, second = LeaderLock(kv, "first"), LeaderLock(kv, "second")
            assert await first.acquire() and not await second.acquire()
            assert await first.renew() and not await second.renew()
            assert (await second.current()) == first.record
            # An answer lost on the way back: the holder finds its own record and adopts it.
            lost = LeaderLock(kv, "first")
            assert await lost.acquire() and lost.held
            await lost.release()  # a clean stop deletes the key ...
            assert await second.acquire()  # ... and the next one takes it at once
            assert not await first.renew() and not first.held  # the old holder knows it lost
            await second.release()
            await kv.put("control-plane", b"not a record")  # written by hand
            assert await first.acquire() and (await second.current()) == first.record
        finally:
            await nc.close()

    asyncio.run(scenario())
