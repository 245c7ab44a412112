"""End to end residency: a lazily placed model loads on its first request; a third model that
would exceed the worker's memory budget evicts the least recently used lazy one, never the
pinned one. Observed through the worker's heartbeats (KV `workers`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from serving.client import Client
from serving.publisher import model_key
from testbed.fleet import LocalFleet, register_served_task, unique_task, wait_until
from testbed.tiny_model import build_tiny_model


def _loaded_bytes(path: Path) -> int:
    """What the runtime reports for this model once loaded (parameters + buffers)."""
    from serving.runtime.model_folder import ModelSpec
    from serving.runtime.model_loading import load_sentence_transformer
    from serving.runtime.pool import module_bytes

    return module_bytes(load_sentence_transformer(ModelSpec(base_path=path), device="cpu"))


def test_lazy_load_on_demand_and_lru_eviction_spares_pinned(tmp_path: Path) -> None:
    paths = [build_tiny_model(tmp_path / f"model-{i}", seed=10 + i) for i in range(3)]
    actual = _loaded_bytes(paths[0])
    on_disk = sum(f.stat().st_size for f in paths[0].rglob("*") if f.is_file())
    # Room for the pinned model plus one lazy one (by the runtime's figure or the placement's
    # on-disk estimate, whichever is larger) but not for a second lazy one.
    budget = actual + max(actual, on_disk) + min(actual, on_disk) // 2
    fleet = LocalFleet(tmp_path / "fleet", workers=1, memory_budget_bytes=budget).start()
    try:
        pinned, lazy1, lazy2 = (unique_task(x) for x in ("pin", "lazya", "lazyb"))
        register_served_task(fleet.reg, pinned, paths[0], pinned=True)
        register_served_task(fleet.reg, lazy1, paths[1])
        register_served_task(fleet.reg, lazy2, paths[2])
        keys = {t: model_key(fleet.reg.get_model(f"m-{t}"), None) for t in (pinned, lazy1, lazy2)}
        worker = fleet.sidecars[0].worker_id

        def loaded() -> list[str]:
            beat = fleet.heartbeats().get(worker)
            return sorted(beat.loaded) if beat else []

        try:
            fleet.serving(pinned, 1)
            # Pinned loads at once; lazy ones wait for demand.
            wait_until(lambda: loaded() == [keys[pinned]], timeout_s=20)
        except AssertionError:
            pytest.fail(f"pinned model not loaded alone (loaded={loaded()}):\n{fleet.logs()}")

        with Client(fleet.gateway_url, max_retries=30) as client:
            first = client.embed_with_info(lazy1, "erste anfrage", kind="query")
            assert first.model_key == keys[lazy1]
            wait_until(lambda: sorted(loaded()) == sorted([keys[pinned], keys[lazy1]]))
            # The third model does not fit: lazy1 (least recently used lazy) makes room.
            second = client.embed_with_info(lazy2, "zweite anfrage", kind="query")
            assert second.model_key == keys[lazy2]
            wait_until(lambda: sorted(loaded()) == sorted([keys[pinned], keys[lazy2]]))
            beat = fleet.heartbeats()[worker]
            assert beat.memory_used <= beat.memory_budget == budget
            # The pinned task still answers, and lazy1 comes back on demand (evicting lazy2).
            vec = client.embed(pinned, "noch da", kind="query")
            assert vec.shape[0] == 1 and np.isfinite(vec).all()
            again = client.embed_with_info(lazy1, "wieder da", kind="query")
            assert again.model_key == keys[lazy1]
            wait_until(lambda: sorted(loaded()) == sorted([keys[pinned], keys[lazy1]]))
    finally:
        fleet.stop()
