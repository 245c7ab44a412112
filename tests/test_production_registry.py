"""Production records in the registry: shadow starts and stops as recorded rows with their
outbox, sampled requests and the agreement summary, labelled live items, stale evidence and
the re-evaluation queue, and the promotion rule on live evidence (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from registry import Conflict, InvalidInput, PermissionDenied, Registry
from registry import entities as e
from registry.promotions import EvidenceStale
from testbed.declared_tasks import declare_suite, fake_fingerprint
from tests.evalrun_fixture import record_run
from tests.test_registry import make_model_dir


def _seed(reg: Registry, tmp_path: Path) -> None:
    declare_suite(reg, "legal-suite")
    reg.add_task("legal", suite="legal-suite")
    for name in ("a", "b", "c"):
        reg.add_model(name, path=make_model_dir(tmp_path / name, name.encode()))
        reg.add_candidate("legal", base=name)
    reg.add_candidate("legal", kind="bm25")


def _sample(
    request_id: str, *, shadow: str | None = "b", at: datetime | None = None
) -> e.SampleCreate:
    return e.SampleCreate(
        task="legal",
        request_id=request_id,
        received_at=at or datetime.now(UTC),
        inputs=2,
        champion="a",
        champion_model_key="a-key",
        champion_epoch=1,
        champion_ms=12.0,
        shadow=shadow,
        lengths=[5, 7],
    )


def test_shadow_starts_and_stops_are_recorded_rows_with_an_outbox(
    registry: Registry, tmp_path: Path
) -> None:
    _seed(registry, tmp_path)
    with pytest.raises(InvalidInput, match="has no champion yet"):
        registry.start_shadow("legal", "b", sample_rate=0.1)
    record_run(registry, "legal", "a", 0.3)
    registry.promote("legal", "a", reason="first")
    with pytest.raises(InvalidInput, match="is the champion"):
        registry.start_shadow("legal", "a", sample_rate=0.1)
    with pytest.raises(InvalidInput, match="no model to place"):
        registry.start_shadow("legal", "bm25", sample_rate=0.1)
    with pytest.raises(InvalidInput, match="sample rate must be a number from 0 to 1"):
        registry.start_shadow("legal", "b", sample_rate=1.5)
    with pytest.raises(PermissionDenied):
        registry.as_actor("v", ("viewer",)).start_shadow("legal", "b", sample_rate=0.1)

    started = registry.as_actor("lead", ("promoter",)).start_shadow(
        "legal", "b", sample_rate=0.25, reason="try b"
    )
    assert (started.action, started.candidate, started.epoch, started.runtime) == (
        "start",
        "b",
        1,
        "torch",
    )
    assert (started.actor, started.reason) == ("lead", "try b")
    assert registry.current_shadow("legal") == started
    assert registry.production_settings("legal").sample_rate == 0.25
    with pytest.raises(Conflict, match="already shadows"):
        registry.start_shadow("legal", "b", sample_rate=0.25)
    assert [s.epoch for s in registry.unpublished_shadows()] == [1]
    registry.mark_shadow_published("legal", 1)
    assert registry.unpublished_shadows() == []

    # Another candidate replaces it (one row); a stop ends it, sampling goes on.
    registry.start_shadow("legal", "c", sample_rate=0.5)
    stopped = registry.stop_shadow("legal", reason="enough")
    assert (stopped.action, stopped.candidate, stopped.epoch) == ("stop", "c", 3)
    assert registry.current_shadow("legal") is None
    assert [(s.action, s.candidate) for s in registry.shadow_history("legal")] == [
        ("stop", "c"),
        ("start", "c"),
        ("start", "b"),
    ]
    assert [(s.action, s.epoch) for s in registry.unpublished_shadows()] == [("stop", 3)]
    assert registry.production_settings("legal").sample_rate == 0.5
    with pytest.raises(InvalidInput, match="has no shadow to stop"):
        registry.stop_shadow("legal")
    actions = [a.action for a in registry.audit_log() if a.action.startswith("shadow.")]
    assert actions == ["shadow.stop", "shadow.start", "shadow.start"]


def test_samples_hold_the_shadows_side_and_summarise_agreement(
    registry: Registry, tmp_path: Path
) -> None:
    _seed(registry, tmp_path)
    start = datetime.now(UTC) - timedelta(hours=1)
    agreement: list[float] = []
    for i in range(30):
        assert registry.record_sample(_sample(f"r{i}", at=start + timedelta(minutes=i)))
        values = [float(i % 3 != 0), 1.0]
        agreement += values
        assert registry.record_shadow_outcome(
            e.ShadowOutcome(
                f"r{i}", "ok", shadow_ms=20.0, agreement=values, agreement_extra={"m": [0.1, 0.3]}
            )
        )
    assert not registry.record_sample(_sample("r0"))  # redelivered: kept once
    registry.record_sample(_sample("shed-1"))
    registry.record_shadow_outcome(e.ShadowOutcome("shed-1", "shed", error="CHAMPION_BUSY"))
    registry.record_sample(_sample("plain", shadow=None))
    assert not registry.record_shadow_outcome(e.ShadowOutcome("unknown", "ok"))

    summary = registry.agreement_summary("legal")
    assert summary.shadow == "b" and summary.inputs == len(agreement)
    assert summary.estimate == pytest.approx(np.mean(agreement))
    assert summary.low is not None and summary.high is not None and summary.estimate is not None
    assert summary.low <= summary.estimate <= summary.high
    assert summary.outcomes == {"pending": 0, "ok": 30, "shed": 1, "error": 0}
    assert summary.extra == {"m": pytest.approx(0.2)}
    assert sum(p.inputs for p in summary.series) == len(agreement)
    assert (summary.champion_ms_p50, summary.shadow_ms_p50) == (12.0, 20.0)

    # Retention (7 days by default): nothing is pruned now, everything after 8 days.
    assert registry.prune_samples() == 0
    assert registry.prune_samples(now=datetime.now(UTC) + timedelta(days=8)) == 32
    assert registry.get_sample("r1") is None


def test_live_items_are_kept_once_and_cut_into_live_versions(
    registry: Registry, tmp_path: Path
) -> None:
    _seed(registry, tmp_path)
    item = e.LiveItemCreate("legal", "r1", 0, {"query": "q", "relevant_ids": ["d1"]}, key="app")
    first = registry.add_live_item(item)
    assert first is not None and first.suite_version is None
    assert registry.add_live_item(item) is None
    registry.add_live_item(e.LiveItemCreate("legal", "r1", 1, {"query": "q2", "relevant_ids": []}))
    assert registry.live_counts("legal") == (2, 2)
    live = declare_suite(
        registry, "legal-suite", fingerprint=fake_fingerprint("legal-suite", 2), live_split="live"
    )
    assert live.splits == ("eval", "dev", "live")
    ids = [i.id for i in registry.live_items("legal")]
    assert registry.mark_live_items_cut("legal", ids, live.version) == 2
    assert registry.mark_live_items_cut("legal", ids, live.version) == 0
    assert registry.live_counts("legal") == (2, 0)
    assert {i.suite_version for i in registry.live_items("legal")} == {2}
    with pytest.raises(InvalidInput, match="live split must be distinct"):
        declare_suite(registry, "legal-suite", fingerprint=fake_fingerprint("x"), live_split="eval")


def test_a_new_version_makes_evidence_stale_queues_it_and_refuses_promotion(
    registry: Registry, tmp_path: Path
) -> None:
    _seed(registry, tmp_path)
    record_run(registry, "legal", "a", 0.30, noise=0.05)
    record_run(registry, "legal", "b", 0.50, noise=0.05)
    record_run(registry, "legal", "c", 0.40, noise=0.05)
    registry.promote("legal", "a", reason="first")
    assert registry.stale_pairings("legal") == []
    assert registry.queue_stale("legal") == []

    declare_suite(registry, "legal-suite", fingerprint=fake_fingerprint("legal-suite", 2))
    stale = registry.stale_pairings("legal", challengers=1)
    assert [(s.candidate, s.role) for s in stale] == [("a", "champion"), ("b", "challenger")]
    assert "its newest run is on legal-suite v1, not v2" in stale[0].reasons[0]
    with pytest.raises(EvidenceStale, match=r"refresh it with `taskfleet eval run legal -c b`"):
        registry.promote("legal", "b", reason="better")
    check = registry.check_promotion("legal", "b")
    assert check.stale and not check.passes

    queued = registry.queue_stale("legal", challengers=1)
    assert [(r.candidate, r.split, r.state, r.suite_version) for r in queued] == [
        ("a", "eval", "queued", 2),
        ("b", "eval", "queued", 2),
    ]
    assert registry.queue_stale("legal", challengers=1) == []  # queued once per version
    running = registry.next_reevaluation()
    assert running is not None and (running.candidate, running.state) == ("a", "running")
    assert registry.requeue_interrupted() == 1  # its control plane died
    running = registry.next_reevaluation()
    assert running is not None and running.candidate == "a"
    run_id = record_run(registry, "legal", "a", 0.30, noise=0.05)
    done = registry.finish_reevaluation(running.id, eval_run_id=run_id)
    assert (done.state, done.eval_run_id) == ("done", run_id)
    failed = registry.next_reevaluation()
    assert failed is not None
    assert registry.finish_reevaluation(failed.id, error="boom").state == "failed"
    assert registry.queue_stale("legal", challengers=1) == []  # a failure is not retried
    assert [s.candidate for s in registry.stale_pairings("legal", challengers=1)] == ["b"]
    record_run(registry, "legal", "b", 0.50, noise=0.05)
    assert registry.check_promotion("legal", "b").passes


def test_the_rule_can_take_live_evidence(registry: Registry, tmp_path: Path) -> None:
    _seed(registry, tmp_path)
    record_run(registry, "legal", "a", 0.30, noise=0.05)
    record_run(registry, "legal", "b", 0.50, noise=0.05)
    registry.promote("legal", "a", reason="first")
    registry.set_production_settings("legal", evidence="live")
    check = registry.check_promotion("legal", "b")
    assert not check.passes and "has no live split yet" in check.reason
    declare_suite(
        registry, "legal-suite", fingerprint=fake_fingerprint("legal-suite", 2), live_split="live"
    )
    for cand, level in (("a", 0.30), ("b", 0.50)):
        record_run(registry, "legal", cand, level, noise=0.05)
    # Offline runs on v2 exist, live ones not: b's live evidence is stale (its live split).
    check = registry.check_promotion("legal", "b")
    assert not check.passes and "on the live split of suite legal-suite@2" in check.reason
    record_run(registry, "legal", "a", 0.40, noise=0.05, split="live")
    record_run(registry, "legal", "b", 0.40, noise=0.05, split="live")  # b: better offline only
    check = registry.check_promotion("legal", "b")
    assert not check.passes and check.evidence == "live" and "exclude zero" in check.reason
    registry.set_production_settings("legal", evidence="both", drift_window=50)
    record_run(registry, "legal", "b", 0.60, noise=0.05, split="live")
    check = registry.check_promotion("legal", "b")
    assert check.passes and check.reason.startswith("offline: ") and "; live: " in check.reason
    with pytest.raises(InvalidInput, match="evidence must be one of offline, live, both"):
        registry.set_production_settings("legal", evidence="vibes")
    with pytest.raises(InvalidInput, match="unknown production setting"):
        registry.set_production_settings("legal", colour="red")
    settings = registry.production_settings("legal")
    assert (settings.evidence, settings.drift_window, settings.live_every) == ("both", 50, 100)


def test_promoting_the_shadow_stops_it(registry: Registry, tmp_path: Path) -> None:
    _seed(registry, tmp_path)
    record_run(registry, "legal", "a", 0.30, noise=0.05)
    record_run(registry, "legal", "b", 0.50, noise=0.05)
    registry.promote("legal", "a", reason="first")
    registry.start_shadow("legal", "b", sample_rate=0.5)
    registry.promote("legal", "b", reason="better on live traffic too")
    assert registry.current_shadow("legal") is None
    stop = registry.shadow_history("legal")[0]
    assert (stop.action, stop.candidate, stop.reason) == ("stop", "b", "promoted to champion")


def test_a_fitted_baseline_shadows_like_a_champion(registry: Registry, tmp_path: Path) -> None:
    """A fitted tfidf-lr is served as a champion (its artifact is its base model), so it can
    shadow one too, placed by sha256 on the Python runtime; a model-free baseline cannot."""
    import functools

    from evals.suites import declare
    from serving.publisher import shadow_placement
    from taskfleet.baseline_builder import fit_baseline
    from tests.kinds_fixture import build_classification

    folder = build_classification(tmp_path / "area")
    registry.add_suite(declare("area-suite", "classification", folder)[0])
    registry.add_task("area", suite="area-suite")
    fit = functools.partial(fit_baseline, data_root=None)
    registry.add_candidate("area", name="champion", kind="tfidf-lr", fit_baseline=fit)
    fitted = registry.add_candidate("area", kind="tfidf-lr", fit_baseline=fit)
    registry.add_candidate("area", name="majority", kind="majority")
    record_run(registry, "area", "champion", 0.3)
    registry.promote("area", "champion", reason="first")
    with pytest.raises(InvalidInput, match="no model to place"):
        registry.start_shadow("area", "majority", sample_rate=0.1)
    with pytest.raises(InvalidInput, match="only the Python runtime"):
        registry.start_shadow("area", "tfidf-lr", sample_rate=0.1, runtime="candle")
    shadow = registry.start_shadow("area", "tfidf-lr", sample_rate=0.1)
    assert (shadow.candidate, shadow.runtime) == ("tfidf-lr", "torch")
    value, _ = shadow_placement(registry, shadow)
    model = registry.get_model(str(fitted.base_model))
    assert value.shadow and value.base.sha256 == model.sha256 and value.adapter is None


def test_every_metric_the_alert_rules_name_is_served(registry: Registry, tmp_path: Path) -> None:
    """deploy/prometheus/alerts.yaml parses and names only figures /api/v1/metrics serves."""
    import re

    import yaml

    from registry import production_metrics

    _seed(registry, tmp_path)
    rules = yaml.safe_load(
        (Path(__file__).resolve().parent.parent / "deploy/prometheus/alerts.yaml").read_text()
    )
    named = {
        name
        for group in rules["groups"]
        for rule in group["rules"]
        for name in re.findall(r"taskfleet_[a-z_]+", rule["expr"])
    }
    assert "taskfleet_production_drifted" in named
    served = production_metrics.render(registry, lambda task: True).decode()
    assert {name for name in named if f"# TYPE {name} gauge" not in served} == set()


def test_traffic_writes_do_not_ring_the_commit_signal(registry: Registry, tmp_path: Path) -> None:
    """The publisher in the same process passes on every signalled commit: a shadow it must
    publish rings; the writes each served request, feedback and login make (samples, shadow
    outcomes, live items, sessions, re-evaluation queue) and its own published marks do not, or
    sampled traffic would keep it passing back to back."""
    _seed(registry, tmp_path)
    record_run(registry, "legal", "a", 0.3)
    registry.promote("legal", "a", reason="first")
    registry.create_api_key("lead", roles=["admin"])
    rings: list[str] = []
    unsubscribe = registry.subscribe_commits(lambda: rings.append("ring"))
    try:
        registry.start_shadow("legal", "b", sample_rate=1.0)
        assert rings == ["ring"]
        for shadow in registry.unpublished_shadows():
            registry.mark_shadow_published(shadow.task, shadow.epoch)
        assert registry.record_sample(_sample("r1"))
        assert registry.record_shadow_outcome(e.ShadowOutcome("r1", "ok", agreement=[1.0, 1.0]))
        item = e.LiveItemCreate("legal", "r1", 0, {"query": "q", "relevant_ids": ["d1"]}, key="app")
        assert registry.add_live_item(item) is not None
        registry.end_session(registry.start_session("lead", max_age_s=60))
        registry.queue_stale("legal")
        while (queued := registry.next_reevaluation()) is not None:
            registry.finish_reevaluation(queued.id, error="not run in this test")
        registry.requeue_interrupted()
        registry.prune_samples(now=datetime.now(UTC) + timedelta(days=8))
        assert rings == ["ring"]
    finally:
        unsubscribe()
