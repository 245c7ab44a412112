"""The fault suite, seconds-long: each fault with a short stream of counted calls in the three
formats. Every call must be answered with its in-process vectors (or end with the error it was
meant to get): lost = 0, duplicated = 0, wrong = 0, no 500. ``make bench`` runs the same
scenarios with a long stream and writes reports/reliability/README.md."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.faults import scenarios as sc
from testbed.faults.reference import Reference
from testbed.fleet import LocalFleet, register_served_task, unique_task
from testbed.tiny_model import build_tiny_model

SIDECAR_ARGS = ["--heartbeat-ms", "300", "--nak-delay-ms", "200", "--max-batch-wait-ms", "2"]
LOAD = sc.Load(calls=90, concurrency=12)


def assert_kept_the_promise(run: sc.FaultRun, expected_answers: int | None = None) -> None:
    row = run.row()
    problems = run.tally.problems()
    assert not problems, (problems, row)
    if expected_answers is not None:
        assert run.tally.answered == expected_answers, row


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    with LocalFleet(tmp_path_factory.mktemp("faults"), workers=2, sidecar_args=SIDECAR_ARGS) as s:
        yield s


@pytest.fixture(scope="module")
def reference(tiny_model_path: Path) -> Reference:
    ref = Reference(tiny_model_path)
    ref.prepare(LOAD.texts())
    return ref


@pytest.fixture(scope="session")
def other_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-b"), seed=7)


@pytest.fixture(scope="session")
def poison_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Its config claims 256 tokens, its position table holds 64: long inputs fail the
    forward pass (a misconfigured model, a real poison input)."""
    path = build_tiny_model(
        tmp_path_factory.mktemp("poison"), max_seq_length=256, max_position_embeddings=64
    )
    config = path / "sentence_bert_config.json"
    data = json.loads(config.read_text())
    data["max_seq_length"] = 256
    config.write_text(json.dumps(data))
    return path


def test_kill_runtime(fleet: LocalFleet, tiny_model_path: Path, reference: Reference) -> None:
    task = sc.serve(fleet, tiny_model_path)
    run = sc.kill_runtime_under_load(fleet, task, reference, LOAD)
    assert_kept_the_promise(run, LOAD.calls)


def test_restart_nats(fleet: LocalFleet, tiny_model_path: Path, reference: Reference) -> None:
    task = sc.serve(fleet, tiny_model_path)
    run = sc.restart_nats_under_load(fleet, task, reference, LOAD)
    assert_kept_the_promise(run, LOAD.calls)


def test_promotion_while_the_control_plane_restarts(
    fleet: LocalFleet, tiny_model_path: Path, other_model_path: Path, reference: Reference
) -> None:
    task = sc.serve(fleet, tiny_model_path)
    name = f"b-{task}"
    fleet.reg.add_model(name, path=other_model_path)
    candidate = fleet.reg.add_candidate(task, base=name)
    other = Reference(other_model_path)
    other.prepare(LOAD.texts())
    references = {
        sc.served_model_key(fleet, f"m-{task}"): reference,
        sc.served_model_key(fleet, name): other,
    }
    run = sc.promote_with_control_plane_restart(
        fleet, task, candidate.name, reference, references, LOAD
    )
    assert_kept_the_promise(run, LOAD.calls)


def test_poison_input_fails_alone(fleet: LocalFleet, poison_model_path: Path) -> None:
    task = sc.serve(fleet, poison_model_path, prefix="poison")
    reference = Reference(poison_model_path)
    reference.prepare(LOAD.texts())
    run = sc.poison_inputs(fleet, task, reference, LOAD, every=10)
    assert_kept_the_promise(run)
    assert run.tally.count("expected") == LOAD.calls // 10
    assert run.tally.answered == LOAD.calls - LOAD.calls // 10


def test_memory_budget_full_evicts_and_loses_nothing(
    tmp_path: Path, tiny_model_path: Path, other_model_path: Path
) -> None:
    # Room for one tiny model, not two: every switch between the tasks evicts and loads.
    with LocalFleet(
        tmp_path, workers=1, memory_budget_bytes=200_000, sidecar_args=SIDECAR_ARGS
    ) as fleet:
        load = sc.Load(calls=48, concurrency=4)
        tasks: dict[str, Reference] = {}
        keys: dict[str, str] = {}
        for model in (tiny_model_path, other_model_path):
            task = unique_task("mem")
            register_served_task(fleet.reg, task, model, pinned=False)
            reference = Reference(model)
            reference.prepare(load.texts())
            tasks[task], keys[task] = reference, sc.served_model_key(fleet, f"m-{task}")
        fleet.ready_for(tasks)
        run = sc.memory_pressure(fleet, tasks, keys, load)
        assert_kept_the_promise(run, load.calls)
        assert run.notes["evictions"] >= 2, run.row()
