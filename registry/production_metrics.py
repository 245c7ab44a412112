"""Prometheus figures of production, read from the registry at scrape time
(``GET /api/v1/metrics`` of the control plane, with any control-plane key; a key with a task
list sees its tasks only). Every control plane answers alike: the figures are the database's.

- ``taskfleet_production_agreement{task,shadow}``, with ``..._agreement_ci_low``/``_high``: the
  shadow's agreement with the champion over the kept samples, and its 95% bootstrap CI;
- ``taskfleet_production_shadow_copies{task,shadow,outcome}``: sampled requests by what the
  shadow made of them (ok, shed, error, pending);
- ``taskfleet_production_drifted{task}`` (1 when the newest drift window drifted) and
  ``taskfleet_production_drift_p_min{task}``: what ``deploy/prometheus/alerts.yaml`` alerts on;
- ``taskfleet_production_live_items{task,state}`` (in a version, waiting),
  ``taskfleet_production_stale_pairings{task}`` and
  ``taskfleet_production_reevaluations{task,state}``.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from registry.store import AbstractStore

CONTENT_TYPE = CONTENT_TYPE_LATEST


def render(registry: AbstractStore, allows: Callable[[str], bool]) -> bytes:
    """The exposition of every task ``allows`` lets the caller see."""
    out = CollectorRegistry()

    def gauge(name: str, doc: str, labels: list[str]) -> Gauge:
        return Gauge(name, doc, labels, registry=out)

    agreement = gauge(
        "taskfleet_production_agreement",
        "Shadow's agreement with the champion on sampled requests (headline measure).",
        ["task", "shadow"],
    )
    low = gauge("taskfleet_production_agreement_ci_low", "Its 95% CI, low.", ["task", "shadow"])
    high = gauge("taskfleet_production_agreement_ci_high", "Its 95% CI, high.", ["task", "shadow"])
    copies = gauge(
        "taskfleet_production_shadow_copies",
        "Sampled requests kept, by what the shadow made of its copy.",
        ["task", "shadow", "outcome"],
    )
    drifted = gauge(
        "taskfleet_production_drifted", "1 when the newest drift window drifted.", ["task"]
    )
    p_min = gauge(
        "taskfleet_production_drift_p_min",
        "Smallest p-value of the newest drift window's signals.",
        ["task"],
    )
    live = gauge(
        "taskfleet_production_live_items",
        "Labelled live items: in a live suite version, or waiting for the next.",
        ["task", "state"],
    )
    stale = gauge(
        "taskfleet_production_stale_pairings",
        "Pairings (champion, shadow, best challengers) whose evidence is stale.",
        ["task"],
    )
    reevaluations = gauge(
        "taskfleet_production_reevaluations",
        "Re-evaluations of stale evidence, by state.",
        ["task", "state"],
    )
    for task in registry.list_tasks():
        name = task.name
        if not allows(name):
            continue
        summary = registry.agreement_summary(name)
        if summary.shadow is not None:
            for outcome, count in summary.outcomes.items():
                copies.labels(name, summary.shadow, outcome).set(count)
            if summary.estimate is not None:
                agreement.labels(name, summary.shadow).set(summary.estimate)
                low.labels(name, summary.shadow).set(summary.low or 0.0)
                high.labels(name, summary.shadow).set(summary.high or 0.0)
        windows = registry.drift_windows(name, limit=1)
        if windows:
            drifted.labels(name).set(1.0 if windows[0].drifted else 0.0)
            p_min.labels(name).set(windows[0].p_min)
        labelled, waiting = registry.live_counts(name)
        live.labels(name, "in_version").set(labelled - waiting)
        live.labels(name, "waiting").set(waiting)
        stale.labels(name).set(len(registry.stale_pairings(name)))
        states: dict[str, int] = {}
        for job in registry.list_reevaluations(name, limit=1000):
            states[job.state] = states.get(job.state, 0) + 1
        for state, count in states.items():
            reevaluations.labels(name, state).set(count)
    return generate_latest(out)
