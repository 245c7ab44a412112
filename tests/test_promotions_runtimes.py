"""A runtime is part of what is promoted: a placement names one, it changes only through the
promotion rule (an eval run through the new runtime, no worse than the serving pairing), and a
pairing the runtime cannot serve is refused for everyone, admins included."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry import Conflict, InvalidInput, Registry
from registry.entities import TrainingRecord
from registry.promotion_rule import RUNTIME_TOLERANCE
from registry.promotions import PromotionRequired, PromotionRuleNotMet
from testbed.declared_tasks import add_task, declare_suite
from tests.evalrun_fixture import record_run as record
from tests.test_registry import make_model_dir


@pytest.fixture
def fleet(registry: Registry, tmp_path: Path) -> Registry:
    add_task(registry, "legal", suite="suite", margin=0.01)
    registry.add_model(
        "a", path=make_model_dir(tmp_path / "a", b"a"), runtime_kinds=["torch", "candle", "http"]
    )
    registry.add_model("b", path=make_model_dir(tmp_path / "b", b"b"))  # torch only
    adapter_dir = tmp_path / "lora"
    adapter_dir.mkdir()
    (adapter_dir / "adapter_config.json").write_text("{}")
    registry.register_adapter(
        "lora",
        base="a",
        source_dir=adapter_dir,
        training=TrainingRecord("0" * 64, "dev", {}, 1, "test"),
    )
    registry.add_candidate("legal", base="a")
    registry.add_candidate("legal", base="b")
    registry.add_candidate("legal", adapter="lora", name="a-lora")
    return registry


def test_runtime_defaults_to_the_evaluated_one_and_reaches_the_placement(fleet: Registry) -> None:
    record(fleet, "legal", "a", 0.30, runtime="candle")
    done = fleet.promote("legal", "a")
    assert done.runtime == "candle"
    placement = fleet.current_placement("legal")
    assert placement is not None and placement.runtime == "candle"
    # A pinned/replicas change keeps the runtime; it cannot move it.
    again = fleet.update_placement("legal", pinned=True, replicas=2)
    assert (again.runtime, again.replicas, again.epoch) == ("candle", 2, placement.epoch + 1)
    assert fleet.update_placement("legal", runtime="candle").epoch == again.epoch  # no change
    with pytest.raises(PromotionRequired, match="runtime switch"):
        fleet.update_placement("legal", runtime="torch", replicas=3)
    latest = fleet.current_placement("legal")
    assert latest is not None and (latest.runtime, latest.replicas) == ("candle", 2)
    # The history row of the placement change names the runtime it kept.
    assert [(p.kind, p.runtime) for p in fleet.list_promotions("legal")] == [
        ("placement", "candle"),
        ("promote", "candle"),
    ]


def test_no_champion_yet_no_runtime_by_placement(fleet: Registry) -> None:
    with pytest.raises(PromotionRequired, match="no champion yet"):
        fleet.update_placement("legal", runtime="candle")
    assert fleet.current_placement("legal") is None


def test_a_runtime_switch_needs_an_equivalent_run_through_the_new_runtime(
    fleet: Registry,
) -> None:
    record(fleet, "legal", "a", 0.30, runtime="torch")
    fleet.promote("legal", "a")
    with pytest.raises(Conflict, match="already the champion"):
        fleet.promote("legal", "a", runtime="torch")
    check = fleet.check_promotion("legal", "a", "candle")
    assert not check.passes and "no eval run through the candle runtime" in check.reason
    with pytest.raises(PromotionRuleNotMet):
        fleet.promote("legal", "a", runtime="candle")
    # Worse by more than the tolerance: refused, even though nothing else changed.
    record(fleet, "legal", "a", 0.30 - 3 * RUNTIME_TOLERANCE, runtime="candle")
    check = fleet.check_promotion("legal", "a", "candle")
    assert not check.passes and "runtime torch -> candle" in check.reason
    record(fleet, "legal", "a", 0.30 - RUNTIME_TOLERANCE / 2, runtime="candle")
    check = fleet.check_promotion("legal", "a", "candle")
    assert check.passes, check.reason
    switched = fleet.promote("legal", "a", runtime="candle")
    assert (switched.candidate, switched.runtime, switched.previous_candidate) == (
        "a",
        "candle",
        "a",
    )
    # A placement change between the switch and the rollback does not hide the old runtime.
    assert fleet.update_placement("legal", replicas=2).runtime == "candle"
    back = fleet.rollback("legal", reason="candle worker pool drained")
    assert (back.candidate, back.runtime, back.replicas) == ("a", "torch", 2)


def test_pairings_a_runtime_cannot_serve_are_refused_even_with_override(fleet: Registry) -> None:
    admin = fleet.as_actor("root", ["admin"])
    record(fleet, "legal", "b", 0.4, runtime="torch")
    with pytest.raises(InvalidInput, match="not marked as servable by the candle runtime"):
        admin.promote("legal", "b", runtime="candle", override=True, reason="try")
    record(fleet, "legal", "a-lora", 0.4, runtime="torch")
    with pytest.raises(InvalidInput, match="http runtime cannot apply LoRA adapters"):
        admin.promote("legal", "a-lora", runtime="http", override=True, reason="try")
    check = fleet.check_promotion("legal", "a-lora", "http")
    assert not check.passes and "LoRA" in check.reason
    with pytest.raises(InvalidInput, match="unknown runtime"):
        fleet.promote("legal", "a", runtime="onnx")


def test_model_runtimes_are_validated_and_audited(fleet: Registry) -> None:
    with pytest.raises(InvalidInput, match="unknown: onnx"):
        fleet.set_model_runtimes("b", ["torch", "onnx"])
    with pytest.raises(InvalidInput):
        fleet.set_model_runtimes("b", [])
    model = fleet.set_model_runtimes("b", ["torch", "candle", "torch"])
    assert model.runtime_kinds == ["torch", "candle"]
    assert fleet.audit_log(1)[0].action == "model.runtimes"


def test_auto_promotion_never_switches_runtimes(fleet: Registry) -> None:
    add_task(fleet, "auto", suite="suite", auto_promote=True)
    fleet.add_candidate("auto", base="a")
    record(fleet, "auto", "a", 0.3, runtime="torch")  # recorded as the runner does: auto step
    assert [p.runtime for p in fleet.list_promotions("auto")] == ["torch"]
    record(fleet, "auto", "a", 0.3, runtime="candle")
    assert fleet.maybe_auto_promote("auto", "a") is None
    assert [p.runtime for p in fleet.list_promotions("auto")] == ["torch"]
    placement = fleet.current_placement("auto")
    assert placement is not None and placement.runtime == "torch"


def head_adapter(fleet: Registry, tmp_path: Path, name: str, head: str) -> str:
    """An adapter on base "a" carrying a task head of ``head`` kind (score or classify)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    (folder / "head.json").write_text(f'{{"kind": "{head}"}}')
    fleet.register_adapter(
        name, base="a", source_dir=folder, training=TrainingRecord("1" * 64, "dev", {}, 1, "test")
    )
    return name


@pytest.mark.parametrize("runtime", ["candle", "http"])
def test_rerank_and_classification_need_a_runtime_that_scores_and_classifies(
    fleet: Registry, tmp_path: Path, runtime: str
) -> None:
    """Candle embeds only and http embeds and scores (cosines of its embeddings, or an
    endpoint's rerank API): a rerank candidate is never promoted onto candle, a cross-encoder
    LoRA or a classifier onto neither, admins included; torch serves all."""
    admin = fleet.as_actor("root", ["admin"])
    declare_suite(fleet, "pairs", kind="rerank")
    declare_suite(fleet, "areas", kind="classification")
    add_task(fleet, "rank", suite="pairs")
    add_task(fleet, "area", suite="areas")
    fleet.add_candidate("rank", base="a", name="bi", kind="embedding")  # cosine = score
    fleet.add_candidate("rank", adapter=head_adapter(fleet, tmp_path, "ce", "score"), name="cross")
    fleet.add_candidate(
        "area", adapter=head_adapter(fleet, tmp_path, "clf", "classify"), name="clf"
    )
    refused = [("rank", "cross", "score"), ("area", "clf", "classify")]
    if runtime == "candle":
        refused.insert(0, ("rank", "bi", "score"))
    else:  # http scores a bi-encoder: what it lacks is a run through it, not a capability
        check = fleet.check_promotion("rank", "bi", runtime)
        assert not check.passes and "has no eval run through the http runtime" in check.reason
    for task, candidate, op in refused:
        kind = fleet.get_task(task).kind
        check = fleet.check_promotion(task, candidate, runtime)
        assert not check.passes
        assert f"the {runtime} runtime cannot" in check.reason, check.reason
        with pytest.raises(InvalidInput, match=f"cannot promote {candidate!r} on {runtime}") as exc:
            admin.promote(task, candidate, runtime=runtime, override=True, reason="try")
        if candidate == "bi":
            assert f"cannot serve {kind} tasks (no {op!r})" in str(exc.value)
        assert fleet.current_placement(task) is None
    # torch can: the first champion of each task is placed on it.
    for task, candidate in (("rank", "bi"), ("area", "clf")):
        done = admin.promote(task, candidate, runtime="torch", override=True, reason="first")
        assert done.runtime == "torch"
