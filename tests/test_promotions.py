"""Promotion rule, rollback, stale forms, double clicks, roles and auto-promotion."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry import Conflict, InvalidInput, NotFound, PermissionDenied, Registry
from registry.promotions import PromotionRuleNotMet
from testbed.declared_tasks import add_task
from tests.evalrun_fixture import QUERIES
from tests.evalrun_fixture import record_run as record
from tests.test_registry import make_model_dir


@pytest.fixture
def fleet(registry: Registry, tmp_path: Path) -> Registry:
    add_task(registry, "legal", suite="suite", margin=0.01)
    add_task(registry, "other", suite="suite")
    for name in ("a", "b", "c"):
        registry.add_model(name, path=make_model_dir(tmp_path / name, name.encode()))
        registry.add_candidate("legal", base=name)
    registry.add_candidate("other", base="a")
    registry.add_candidate("legal", kind="bm25")
    return registry


def test_promote_by_rule_then_rollback(fleet: Registry) -> None:
    record(fleet, "legal", "a", 0.30)
    first = fleet.promote("legal", "a")
    assert (first.candidate, first.previous_candidate, first.epoch) == ("a", None, 1)

    record(fleet, "legal", "b", 0.40, noise=0.05)
    check = fleet.check_promotion("legal", "b")
    assert check.passes and check.ci_low is not None and check.ci_low > 0
    assert check.paired_queries == len(QUERIES)
    second = fleet.promote("legal", "b", reason="better on the eval split")
    assert (second.candidate, second.previous_candidate, second.epoch) == ("b", "a", 2)
    assert fleet.current_placement("legal").candidate == "b"  # type: ignore[union-attr]

    # Double click: the second identical request changes nothing.
    with pytest.raises(Conflict, match="already the champion"):
        fleet.promote("legal", "b")
    assert len(fleet.list_promotions("legal")) == 2

    back = fleet.rollback("legal", reason="latency regression")
    assert (back.kind, back.candidate, back.previous_candidate, back.epoch) == (
        "rollback",
        "a",
        "b",
        3,
    )
    assert fleet.champion("legal").name == "a"  # type: ignore[union-attr]
    assert [p.kind for p in fleet.list_promotions("legal")] == ["rollback", "promote", "promote"]


def test_rule_not_met_needs_admin_override_with_reason(fleet: Registry) -> None:
    record(fleet, "legal", "a", 0.30)
    fleet.promote("legal", "a")
    record(fleet, "legal", "c", 0.305)  # better, but by less than the margin
    check = fleet.check_promotion("legal", "c")
    assert not check.passes and "margin" in check.reason
    promoter = fleet.as_actor("ann", roles=["promoter"])
    with pytest.raises(PromotionRuleNotMet, match="an admin may override"):
        promoter.promote("legal", "c")
    with pytest.raises(PermissionDenied, match="admin"):
        promoter.promote("legal", "c", override=True, reason="trust me")
    admin = fleet.as_actor("root", roles=["admin"])
    with pytest.raises(InvalidInput, match="needs a reason"):
        admin.promote("legal", "c", override=True)
    done = admin.promote("legal", "c", override=True, reason="cheaper to serve")
    assert done.actor == "root" and done.reason == "cheaper to serve"


def test_refusals_change_nothing(fleet: Registry) -> None:
    record(fleet, "legal", "a", 0.30)
    record(fleet, "legal", "b", 0.50)
    viewer = fleet.as_actor("vic", roles=["viewer"])
    with pytest.raises(PermissionDenied):
        viewer.promote("legal", "a")
    with pytest.raises(NotFound, match="task 'other' has no candidate 'b'"):
        fleet.promote("other", "b")
    with pytest.raises(InvalidInput, match="bm25"):
        fleet.promote("legal", "bm25")
    fleet.promote("legal", "a")
    with pytest.raises(Conflict, match="changed meanwhile"):
        fleet.promote("legal", "b", expected_champion=None)  # the form saw no champion
    with pytest.raises(InvalidInput, match="no previous champion"):
        fleet.as_actor("p", roles=["promoter"]).rollback("legal")
    assert [p.candidate for p in fleet.list_promotions("legal")] == ["a"]
    assert fleet.current_placement("legal").epoch == 1  # type: ignore[union-attr]


def test_auto_promotion_records_the_system(registry: Registry, tmp_path: Path) -> None:
    add_task(registry, "auto", suite="suite", margin=0.01, auto_promote=True)
    for name in ("a", "b"):
        registry.add_model(name, path=make_model_dir(tmp_path / name, name.encode()))
        registry.add_candidate("auto", base=name)
    record(registry, "auto", "a", 0.2)
    assert registry.champion("auto").name == "a"  # type: ignore[union-attr]
    record(registry, "auto", "b", 0.205)  # within the margin: stays
    assert registry.champion("auto").name == "a"  # type: ignore[union-attr]
    record(registry, "auto", "b", 0.4, noise=0.02)
    latest = registry.list_promotions("auto")[0]
    assert (latest.candidate, latest.actor) == ("b", "system:auto-promote")


def test_recording_a_run_never_promotes_the_caller_asks_for_it(
    registry: Registry, tmp_path: Path
) -> None:
    """Auto-promotion is a step of its own: record_eval_run only records, even on a task that
    opted in; maybe_auto_promote (what the eval runner calls next) promotes."""
    from registry.entities import EvalRunCreate

    add_task(registry, "auto", suite="suite", auto_promote=True)
    registry.add_model("a", path=make_model_dir(tmp_path / "a", b"a"))
    registry.add_candidate("auto", base="a")
    suite = registry.get_suite("suite")
    registry.record_eval_run(
        EvalRunCreate(
            task="auto",
            candidate="a",
            suite_name=suite.name,
            suite_version=str(suite.version),
            suite_fingerprint=suite.fingerprint,
            split=suite.test_split,
            main_metric="ndcg_at_10",
            metrics={"ndcg_at_10": 0.3},
            ci={"ndcg_at_10": (0.28, 0.32)},
            cost={"items_per_s": 100.0},
            per_query={q: 0.3 for q in QUERIES},
        )
    )
    assert registry.champion("auto") is None and registry.list_promotions("auto") == []
    promoted = registry.maybe_auto_promote("auto", "a")
    assert promoted is not None
    assert (promoted.candidate, promoted.actor) == ("a", "system:auto-promote")
    assert registry.maybe_auto_promote("auto", "a") is None  # already the champion
