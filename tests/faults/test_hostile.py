"""No caller can take a task down: one authorised caller sends the worst requests it may while
another sends normal traffic through the same gateway, task and (real) worker.

The normal caller must get every answer (its in-process vectors) and its p99 must stay near
its p99 without the attack; the attacker's minimum epoch far ahead and its texts above the
task's limit are refused at the gateway, at once, never queued; its floods of the most inputs
pass only as fast as its token quota lets them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.faults import scenarios as sc
from testbed.faults.reference import Reference
from testbed.fleet import LocalFleet, wait_until

SIDECAR_ARGS = ["--heartbeat-ms", "300", "--nak-delay-ms", "200", "--max-batch-wait-ms", "2"]
LOAD = sc.Load(calls=120, concurrency=3, protocols=("msgpack",), timeout_ms=20_000)
# The attacker's token burst holds 64 texts as long as the tiny model reads (64 tokens); it may
# spend two such floods a second.
FLOOD_INPUTS = 64
FLOOD_TOKENS = FLOOD_INPUTS * 64
TOKEN_RATE = 2 * FLOOD_TOKENS


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    root = tmp_path_factory.mktemp("hostile")
    with LocalFleet(root, workers=1, sidecar_args=SIDECAR_ARGS, require_auth=True) as stack:
        yield stack


@pytest.fixture(scope="module")
def reference(tiny_model_path: Path) -> Reference:
    ref = Reference(tiny_model_path)
    ref.prepare(LOAD.texts())
    return ref


@pytest.fixture(scope="module")
def task(fleet: LocalFleet, tiny_model_path: Path) -> str:
    return sc.serve(fleet, tiny_model_path, prefix="hostile")


@pytest.fixture(scope="module")
def keys(fleet: LocalFleet, task: str) -> tuple[str, str]:
    """(normal, attacker): the attacker has a quota (10 requests/s, two floods' tokens a
    second), the normal caller none."""
    _, normal = fleet.reg.create_api_key("normal-app", roles=["caller"])
    _, attacker = fleet.reg.create_api_key(
        "greedy-app",
        roles=["caller"],
        rate_limit_per_s=10,
        rate_burst=10,
        token_rate_per_s=TOKEN_RATE,
        token_burst=FLOOD_TOKENS,
    )
    import httpx

    def accepted() -> bool:  # the control plane has published both keys to the gateway
        return all(
            httpx.post(
                f"{fleet.gateway_url}/v1/tasks/{task}",
                json={"inputs": ["hallo"]},
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
            ).status_code
            == 200
            for key in (normal, attacker)
        )

    wait_until(accepted, timeout_s=30)
    return normal, attacker


def test_a_hostile_caller_cannot_take_the_task_down(
    fleet: LocalFleet, task: str, reference: Reference, keys: tuple[str, str]
) -> None:
    normal, attacker = keys
    before = sc.no_fault(fleet, task, reference, LOAD, api_key=normal)
    assert not before.tally.problems(), before.row()
    run = sc.hostile_caller(
        fleet,
        task,
        reference,
        LOAD,
        normal_key=normal,
        attacker_key=attacker,
        lanes=2,
        flood_inputs=FLOOD_INPUTS,
    )
    # The baseline is measured on both sides of the attack: what else the machine runs (other
    # test files' fleets, here on 2 cores) changes within a minute, and a bound against one
    # earlier baseline failed on such a change, not on the attack (p99 1.34 s against 0.13 s).
    after = sc.no_fault(fleet, task, reference, LOAD, api_key=normal)
    assert not after.tally.problems(), after.row()
    row = run.row()
    base = max(before.row(), after.row(), key=lambda r: r["p99_all_s"])
    print(f"\nbaseline: {before.row()}\nattack:   {row}\nafter:    {after.row()}")
    assert not run.tally.problems(), (row, fleet.logs())
    assert run.tally.answered == LOAD.calls, row
    # What the attacker got: refusals at once for the epoch and the huge text, 200 or 429 for
    # its floods, never a 5xx from the task it attacked.
    codes = run.notes["attacker_codes"]
    assert codes.get("NOT_READY", 0) > 0 and codes.get("PAYLOAD_TOO_LARGE", 0) > 0, row
    assert run.notes["attacker"].get("200", 0) > 0 and codes.get("RATE_LIMITED", 0) > 0, row
    assert set(codes) <= {"NOT_READY", "PAYLOAD_TOO_LARGE", "RATE_LIMITED"}, row
    # The epoch refusal waits for a converging placement (2 s) at most, never the caller's 60 s.
    assert run.notes["slowest_refusal_s"] < 10, row
    # The normal caller barely notices (generous: a shared 2-core machine runs attacker,
    # gateway, worker and both clients).
    assert row["p99_all_s"] <= max(3 * base["p99_all_s"], base["p99_all_s"] + 1.0), (row, base)
