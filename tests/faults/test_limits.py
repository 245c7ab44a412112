"""Requests at the documented limit (2048 inputs) are answered through every public format.

A 2048 x 384 float32 reply is 3 MiB, three times NATS's default ``max_payload``: the worker must
move it through the object store, never drop it. Each answer is checked row by row against the
in-process vectors of its texts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.counting import PROTOCOLS, Call, CountingClient, Protocol
from tests.faults.reference import Reference
from tests.fleet_fixture import LocalFleet, register_served_task
from tests.nats_fixture import unique_task

LIMIT = 2048
# Generous: on a shared 2-core machine one 2048-text batch can take tens of seconds.
DEADLINE_MS = 180_000


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    stack = LocalFleet(tmp_path_factory.mktemp("limits"), workers=1).start()
    try:
        yield stack
    finally:
        stack.stop()


def _serve(fleet: LocalFleet, model: Path) -> str:
    task = unique_task("limit")
    placement = register_served_task(fleet.reg, task, model, pinned=True)
    try:
        fleet.serving(task, placement.epoch)
    except AssertionError:
        pytest.fail(f"no worker serves the task:\n{fleet.logs()}")
    return task


def limit_texts(n: int = LIMIT) -> list[str]:
    return [f"anfrage {i} zum mietvertrag und der frist {i % 13}" for i in range(n)]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_2048_inputs_of_384_dims_are_answered(
    fleet: LocalFleet, wide_model_path: Path, protocol: Protocol
) -> None:
    reference = Reference(wide_model_path)
    texts = limit_texts()
    reference.prepare(texts)
    task = _serve(fleet, wide_model_path)

    async def run() -> None:
        async with CountingClient(fleet.gateway_url, task, reference, retry_budget_s=240) as client:
            record = await client.call(Call(texts, protocol=protocol, timeout_ms=DEADLINE_MS))
        assert record.outcome == "answered", (record, fleet.logs())

    asyncio.run(run())


def test_2048_inputs_of_1024_dims_are_answered(fleet: LocalFleet, wider_model_path: Path) -> None:
    """8 MiB of float32 per reply (11 MiB as OpenAI's base64): the same path, twice as wide."""
    reference = Reference(wider_model_path)
    texts = limit_texts()
    reference.prepare(texts, "passage")
    task = _serve(fleet, wider_model_path)

    async def run() -> None:
        async with CountingClient(fleet.gateway_url, task, reference, retry_budget_s=240) as client:
            calls = [
                Call(texts, kind="passage", protocol=p, timeout_ms=DEADLINE_MS)
                for p in ("msgpack", "openai")
            ]
            tally = await client.run_all(calls, concurrency=2)
        assert tally.answered == 2, (tally.summary(), tally.records)

    asyncio.run(run())
