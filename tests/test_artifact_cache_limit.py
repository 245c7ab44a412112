"""A worker's artifact cache with a size limit (real nats-server, sidecar and runtime): after a
fetch, the least recently used folders no current placement names are removed until the cache
fits; what current placements name stays, even over the limit."""

from __future__ import annotations

from pathlib import Path

import httpx

from registry.fingerprint import tree_sha256
from testbed.fleet import LocalFleet, register_served_task, unique_task, wait_until
from testbed.tiny_model import build_tiny_model

SIDECAR_ARGS = ["--heartbeat-ms", "300", "--nak-delay-ms", "200", "--max-batch-wait-ms", "2"]


def _ok(fleet: LocalFleet, task: str, min_epoch: int = 1) -> None:
    """A 200 for ``task`` from epoch ``min_epoch`` or newer (retried while the gateway has not
    yet seen the task or the worker is still loading)."""

    def call() -> httpx.Response | None:
        r = httpx.post(
            f"{fleet.gateway_url}/v1/tasks/{task}",
            json={"inputs": ["Wer haftet?"]},
            headers={"X-Taskfleet-Timeout-Ms": "30000", "X-Taskfleet-Min-Epoch": str(min_epoch)},
            timeout=40,
        )
        return r if r.status_code == 200 else None

    try:
        wait_until(call, timeout_s=90, every_s=0.5)
    except AssertionError:
        raise AssertionError(fleet.logs()) from None


def test_lru_eviction_spares_what_current_placements_name(tmp_path: Path) -> None:
    m1, m2, m3 = (build_tiny_model(tmp_path / f"m{i}", seed=10 + i) for i in (1, 2, 3))
    size = tree_sha256(m1).size_bytes
    limit = size * 3 // 2  # room for one model and a half
    fleet = LocalFleet(
        tmp_path / "fleet",
        workers=1,
        separate_caches=True,
        sidecar_args=[*SIDECAR_ARGS, "--artifact-cache-max-bytes", str(limit)],
    ).start()
    try:
        cache = tmp_path / "fleet" / "cache0" / "sha256"
        other, moving = unique_task("keep"), unique_task("move")
        register_served_task(fleet.reg, other, m3, model_name="m3")
        p = register_served_task(fleet.reg, moving, m1, model_name="m1")
        # Lazy placements: the first request loads (and fetches) each model.
        _ok(fleet, other)
        _ok(fleet, moving, p.epoch)
        sha = {n: fleet.reg.get_model(n).sha256 for n in ("m1", "m3")}
        # Over the limit, but both are named by current placements: both stay.
        assert {d.name for d in cache.iterdir()} == {sha["m1"], sha["m3"]}
        log = fleet.sidecars[0].log_path.read_text()
        assert "over its limit" in log and "evicted artifact" not in log, fleet.logs()

        # The moving task is promoted onto m2: m1 is no longer named and goes first.
        fleet.reg.add_model("m2", path=m2)
        sha["m2"] = fleet.reg.get_model("m2").sha256
        candidate = fleet.reg.add_candidate(moving, base="m2")
        promoted = fleet.reg.promote(moving, candidate.name, override=True, reason="test")
        _ok(fleet, moving, promoted.epoch)  # a worker still on epoch 1 does not answer
        _ok(fleet, other)
        assert {d.name for d in cache.iterdir()} == {sha["m2"], sha["m3"]}
        log = fleet.sidecars[0].log_path.read_text()
        assert log.count("evicted artifact") == 1 and sha["m1"] in log, fleet.logs()
    finally:
        fleet.stop()
