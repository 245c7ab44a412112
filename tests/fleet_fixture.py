"""Helpers shared by the fleet control-loop tests and the end-to-end serving tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from registry import Registry
from registry import entities as e

T = TypeVar("T")


def register_served_task(
    registry: Registry,
    task: str,
    model_dir: Path,
    *,
    model_name: str | None = None,
    pinned: bool = False,
    adapter_dir: Path | None = None,
) -> e.Placement:
    """Task + base model (+ adapter) + candidate + placement: what promotion would leave."""
    from registry.entities import TrainingRecord

    registry.add_task(task, suite="test-suite")
    name = model_name or f"m-{task}"
    try:
        registry.get_model(name)
    except Exception:
        registry.add_model(name, path=model_dir)
    adapter = None
    if adapter_dir is not None:
        adapter = f"a-{task}"
        registry.register_adapter(
            adapter,
            base=name,
            source_dir=adapter_dir,
            training=TrainingRecord(
                data_fingerprint="0" * 64,
                train_split="dev",
                hyperparameters={},
                seed=1,
                code_version="test",
            ),
        )
    candidate = registry.add_candidate(task, base=name, adapter=adapter)
    return registry.set_placement(task, candidate.name, pinned=pinned)


async def eventually(
    probe: Callable[[], Awaitable[T | None]], timeout_s: float = 15.0, every_s: float = 0.1
) -> T:
    """Poll ``probe`` until it returns something truthy; fail with the last value otherwise."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(every_s)
    raise AssertionError(f"condition not met within {timeout_s}s (last value: {last!r})")


def wait_until(probe: Callable[[], T | None], timeout_s: float = 15.0, every_s: float = 0.1) -> T:
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"condition not met within {timeout_s}s (last value: {last!r})")
