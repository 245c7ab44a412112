"""Roles as separate processes (testbed/machines.py, the harness of benchmarks/scale_out.py): 3
NATS nodes, the control plane as `taskfleet serve` on PostgreSQL, a `taskfleet gateway` and a
`taskfleet worker` with its own cache. With PostgreSQL stopped the gateway keeps answering and a
promotion through the control plane's REST API fails with 503 DATABASE_ERROR, retryable; once
the database is back the same promotion works and reaches the worker. With the control plane
killed the gateway keeps answering too. The full run (2 gateways, 3 workers, every fault under
a counted stream, scaling) is `benchmarks/scale_out.py` in make bench."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from testbed.declared_tasks import add_task
from testbed.fleet import wait_until
from testbed.machines import Machines
from testbed.tiny_model import build_tiny_model

# A dozen processes, 1-2 minutes: run by `make bench` (make test has the in-process smoke,
# tests/test_scale_out.py).
pytestmark = [pytest.mark.slow, pytest.mark.bench]  # ~1-2 min: make bench


def _call(machines: Machines, text: str) -> httpx.Response:
    return httpx.post(
        f"{machines.gateways[0].url}/v1/tasks/machines",
        json={"inputs": [text]},
        headers={"Authorization": f"Bearer {machines.caller_key}"},
        timeout=60,
    )


@pytest.mark.timeout(400)
def test_database_and_control_plane_down(tmp_path: Path) -> None:
    model_a = build_tiny_model(tmp_path / "a", seed=31)
    model_b = build_tiny_model(tmp_path / "b", seed=32)
    with Machines(tmp_path / "m", workers=1, gateways=1) as machines:
        reg = machines.reg
        add_task(reg, "machines")
        reg.add_model("ma", path=model_a)
        reg.add_model("mb", path=model_b)
        reg.add_candidate("machines", base="ma")
        reg.add_candidate("machines", base="mb")
        first = machines.promote("machines", "ma", pinned=True)
        assert first.status_code == 201, first.text
        machines.serving("machines", first.json()["epoch"], workers=1)
        assert _call(machines, "vorher").status_code == 200

        machines.pg.halt()
        refused = machines.promote("machines", "mb")
        error = refused.json()["error"]
        assert refused.status_code == 503, refused.text
        assert error["code"] == "DATABASE_ERROR" and error["retryable"] is True
        answers = [_call(machines, f"ohne datenbank {i}") for i in range(5)]
        assert [a.status_code for a in answers] == [200] * 5
        assert all(a.headers["X-Taskfleet-Epoch"] == str(first.json()["epoch"]) for a in answers)
        machines.pg.start()

        def promoted() -> httpx.Response | None:
            again = machines.promote("machines", "mb")
            if again.status_code == 503 and again.json()["error"]["retryable"]:
                time.sleep(0.5)
                return None
            return again

        second = wait_until(promoted, timeout_s=60)
        assert second.status_code == 201, second.text
        epoch = second.json()["epoch"]
        machines.serving("machines", epoch, workers=1)
        wait_until(
            lambda: _call(machines, "danach").headers.get("X-Taskfleet-Epoch") == str(epoch),
            timeout_s=60,
        )

        machines.cp.kill()
        answers = [_call(machines, f"ohne control plane {i}") for i in range(5)]
        assert [a.status_code for a in answers] == [200] * 5, machines.logs()
