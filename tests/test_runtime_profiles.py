"""Runtime profiles (issue 21): the registry records one per (model sha256, machine class) and
writes a placement epoch for every task serving the model; placements carry every profile of
their base; a real worker applies only the one of its own machine class (its batching knobs,
and its runtime knobs through a load of its own key), reports it in its heartbeat, also when
started after the profile was recorded, and answers with the in-process vectors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from registry import Registry
from registry import entities as e
from registry.errors import InvalidInput, NotFound, PermissionDenied
from serving.client import Client
from serving.machine import machine_class
from serving.publisher import model_key, placement_value
from testbed.faults.scenarios import serve
from testbed.fleet import LocalFleet, register_served_task, wait_until

OTHER_CLASS = "cpu:Some Other Processor x64"
TEXTS = ["Der Mieter muss die Kündigung schriftlich erklären.", "haus", "Kaution " * 40]


def profile(model: str, machine: str, **settings: object) -> e.ProfileCreate:
    return e.ProfileCreate(
        model=model,
        machine_class=machine,
        settings=e.RuntimeSettings(**settings),  # type: ignore[arg-type]
        task="t",
        p99_bound_ms=500.0,
        throughput=40.0,
        default_throughput=30.0,
        sweep=[{"settings": settings, "throughput": 40.0}],
    )


def test_record_replace_remove_and_the_epochs_they_write(
    registry: Registry, tiny_model_path: Path
) -> None:
    register_served_task(registry, "served", tiny_model_path, model_name="tiny")
    register_served_task(registry, "other", tiny_model_path, model_name="tiny")
    before = {t: registry.current_placement(t).epoch for t in ("served", "other")}  # type: ignore[union-attr]
    first = registry.record_profile(profile("tiny", OTHER_CLASS, max_batch_tokens=4096))
    assert first.settings.changed() == {"max_batch_tokens": 4096}
    assert first.model_sha256 == registry.get_model("tiny").sha256
    # Every task serving the model gets a new epoch, the history saying why.
    for task, epoch in before.items():
        placement = registry.current_placement(task)
        assert placement is not None and placement.epoch == epoch + 1
        assert placement.published_at is None  # in the outbox
        newest = registry.list_promotions(task)[0]
        assert newest.kind == "placement" and f"runtime profile {first.id}" in newest.reason
    again = registry.record_profile(profile("tiny", OTHER_CLASS, engine="onnx", runtimes=2))
    assert again.id == first.id  # one profile per (model, machine class): replaced
    assert again.settings.changed() == {"engine": "onnx", "runtimes": 2}
    mine = registry.record_profile(profile("tiny", machine_class(), max_batch_wait_ms=1))
    assert [p.machine_class for p in registry.list_profiles("tiny")] == sorted(
        [OTHER_CLASS, machine_class()]
    )
    assert registry.profiles_for(first.model_sha256) == registry.list_profiles()
    removed = registry.remove_profile("tiny", OTHER_CLASS)
    assert removed.id == first.id
    assert [p.id for p in registry.list_profiles()] == [mine.id]
    assert registry.current_placement("served").epoch == before["served"] + 4  # type: ignore[union-attr]
    with pytest.raises(NotFound):
        registry.remove_profile("tiny", OTHER_CLASS)


@pytest.mark.parametrize(
    ("settings", "machine", "says"),
    [
        ({"max_padding": 1.5}, OTHER_CLASS, "max_padding must be within"),
        ({"runtimes": 0}, OTHER_CLASS, "runtimes must be within"),
        ({"intra_op_threads": 1.5}, OTHER_CLASS, "must be a whole number"),
        ({"engine": "tensorrt"}, OTHER_CLASS, "unknown engine 'tensorrt'"),
        ({}, "laptop", "machine class 'laptop' must read"),
    ],
)
def test_bad_profiles_are_one_line(
    registry: Registry, tiny_model_path: Path, settings: dict[str, object], machine: str, says: str
) -> None:
    registry.add_model("tiny", path=tiny_model_path)
    with pytest.raises(InvalidInput, match=says):
        registry.record_profile(profile("tiny", machine, **settings))
    assert registry.list_profiles() == []


def test_a_viewer_cannot_record_a_profile(registry: Registry, tiny_model_path: Path) -> None:
    registry.add_model("tiny", path=tiny_model_path)
    with pytest.raises(PermissionDenied):
        registry.as_actor("v", ["viewer"]).record_profile(profile("tiny", OTHER_CLASS))


def test_a_placement_carries_every_profile_of_its_base(
    registry: Registry, tiny_model_path: Path
) -> None:
    register_served_task(registry, "served", tiny_model_path, model_name="tiny")
    registry.record_profile(profile("tiny", OTHER_CLASS, max_batch_tokens=4096, engine="onnx"))
    registry.record_profile(profile("tiny", machine_class(), intra_op_threads=1))
    current = registry.current_placement("served")
    assert current is not None
    value, _ = placement_value(registry, current)
    carried = {p.machine_class: p for p in value.profiles or []}
    assert set(carried) == {OTHER_CLASS, machine_class()}
    assert carried[OTHER_CLASS].max_batch_tokens == 4096
    assert carried[OTHER_CLASS].engine == "onnx"
    assert carried[machine_class()].intra_op_threads == 1
    assert carried[machine_class()].max_batch_tokens is None


# ---- a real worker ---------------------------------------------------------------------------
def _vectors(fleet: LocalFleet, task: str) -> np.ndarray:
    with Client(fleet.gateway_url, timeout_s=120) as client:
        return np.asarray(client.embed(task, TEXTS, kind="passage"))


def _reported(fleet: LocalFleet, task: str, epoch: int) -> tuple[dict[str, int], list[str]]:
    """(the worker's reported profiles, its loaded keys) once it serves ``epoch``."""

    def probe() -> tuple[dict[str, int], list[str]] | None:
        beat = fleet.heartbeat(fleet.sidecars[0].worker_id)
        if beat is None or beat.epochs.get(task) != epoch:
            return None
        return dict(beat.profiles or {}), list(beat.loaded)

    return wait_until(probe, timeout_s=180)


def test_a_worker_applies_only_the_profile_of_its_machine_class(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    expected = SentenceTransformer(str(tiny_model_path), device="cpu").encode(TEXTS)
    with LocalFleet(tmp_path, workers=1) as fleet:
        assert fleet.machine_class == machine_class()
        task = serve(fleet, tiny_model_path, prefix="profile")
        model = f"m-{task}"
        plain_key = model_key(fleet.reg.get_model(model), None)

        # Tuned elsewhere: carried by the placement, never applied here.
        fleet.reg.record_profile(profile(model, OTHER_CLASS, runtimes=2, max_batch_tokens=64))
        epoch = fleet.reg.current_placement(task).epoch  # type: ignore[union-attr]
        profiles, loaded = _reported(fleet, task, epoch)
        assert profiles == {}
        assert loaded == [plain_key]
        np.testing.assert_allclose(_vectors(fleet, task), expected, atol=1e-5)

        # Tuned on this class: applied, the model loaded again as its own key, reported.
        mine = fleet.reg.record_profile(
            profile(model, machine_class(), intra_op_threads=1, runtimes=2, max_padding=0.5)
        )
        epoch = fleet.reg.current_placement(task).epoch  # type: ignore[union-attr]
        profiles, loaded = _reported(fleet, task, epoch)
        assert profiles == {task: mine.id}
        assert f"{plain_key}~t1-r2-p0.5" in loaded
        np.testing.assert_allclose(_vectors(fleet, task), expected, atol=1e-5)

        # A worker started after the tuning reports it too (the placement carries it).
        sidecar = fleet.sidecars[0]
        sidecar.stop()
        sidecar.start()
        profiles, _ = _reported(fleet, task, epoch)
        assert profiles == {task: mine.id}
        np.testing.assert_allclose(_vectors(fleet, task), expected, atol=1e-5)
        # The fleet watcher mirrors what the heartbeat says into the registry.
        wait_until(
            lambda: any(w.profiles == {task: mine.id} for w in fleet.reg.list_workers()),
            timeout_s=30,
        )
