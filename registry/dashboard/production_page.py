"""What the production page of a task shows (``/tasks/{task}/production``), from the registry:
the shadow and its agreement over time, offline and live scores side by side with their CIs
(and the paired CI of shadow minus champion on the same live items), drift, staleness and the
re-evaluation queue. No HTML here (``templates/production.html``)."""

from __future__ import annotations

from dataclasses import dataclass

from registry import entities as e
from registry.bootstrap import Interval, paired_run_difference
from registry.service import Registry


@dataclass(frozen=True)
class Scores:
    """One candidate's offline (test split) and live (live split) runs on the newest version."""

    candidate: str
    role: str  # "champion" | "shadow" | "challenger"
    offline: e.EvalRun | None
    live: e.EvalRun | None

    @staticmethod
    def ci(run: e.EvalRun | None) -> tuple[float, float] | None:
        return run.ci.get(run.main_metric) if run else None


@dataclass(frozen=True)
class ProductionPage:
    task: e.Task
    suite: e.Suite
    settings: e.ProductionSettings
    champion: e.Candidate | None
    shadow: e.Shadow | None
    agreement: e.AgreementSummary
    scores: list[Scores]
    # Shadow minus champion on the same live items (paired bootstrap), and how many items.
    live_difference: tuple[Interval, int] | None
    drift: list[e.DriftWindow]
    stale: list[e.Staleness]
    reevaluations: list[e.Reevaluation]
    live_items: int
    live_waiting: int
    candidates: list[e.Candidate]

    @property
    def drifted(self) -> e.DriftWindow | None:
        """The newest drift window, when it drifted (the page's flag)."""
        return self.drift[0] if self.drift and self.drift[0].drifted else None

    def drift_threshold(self, window: e.DriftWindow) -> float:
        """The p-value below which a signal of ``window`` raises the flag (Bonferroni)."""
        return window.alpha / max(len(window.signals), 1)


def production_page(reg: Registry, task: str) -> ProductionPage:
    record = reg.get_task(task)
    suite = reg.get_suite(record.suite)
    champion = reg.champion(task)
    shadow = reg.current_shadow(task)
    runs = reg.list_eval_runs(task)

    def newest(candidate: str, split: str | None) -> e.EvalRun | None:
        for run in runs:  # newest first
            same = run.suite_fingerprint == suite.fingerprint and run.split == split
            if run.candidate == candidate and same:
                return run
        return None

    names = [champion.name] if champion else []
    if shadow is not None and shadow.candidate not in names:
        names.append(shadow.candidate)
    for run in runs:
        if run.suite_fingerprint == suite.fingerprint and run.candidate not in names:
            names.append(run.candidate)
    scores = []
    for name in names:
        role = "champion" if champion and name == champion.name else "challenger"
        if shadow is not None and name == shadow.candidate:
            role = "shadow"
        scores.append(
            Scores(name, role, newest(name, suite.test_split), newest(name, suite.live_split))
        )
    difference = None
    if champion is not None and shadow is not None and suite.live_split:
        mine, theirs = (
            newest(shadow.candidate, suite.live_split),
            newest(champion.name, suite.live_split),
        )
        if mine is not None and theirs is not None:
            try:
                difference = paired_run_difference(mine, theirs)
            except ValueError:
                difference = None
    labelled, waiting = reg.live_counts(task)
    return ProductionPage(
        task=record,
        suite=suite,
        settings=reg.production_settings(task),
        champion=champion,
        shadow=shadow,
        agreement=reg.agreement_summary(task),
        scores=scores,
        live_difference=difference,
        drift=reg.drift_windows(task, limit=20),
        stale=reg.stale_pairings(task),
        reevaluations=reg.list_reevaluations(task, limit=20),
        live_items=labelled,
        live_waiting=waiting,
        candidates=[c for c in reg.list_candidates(task) if c.base_model is not None],
    )
