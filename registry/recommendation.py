"""Which candidate a task should serve, and why: a pure function of the eval runs and costs.

``recommend`` reads the ranking run of every candidate on the suite version the rule uses, with
its serving cost (registry/costs.py) and whether the fleet can serve it. The best candidate is
the one with the highest main metric. Under the task's preference ``best`` it is the
recommendation. Under ``cheapest``, every other servable candidate is compared with the best
by the paired bootstrap of the main metric: one whose 95% CI lower bound lies above -margin is
*non-inferior*, and among the best and the non-inferior ones the cheapest per million items is
recommended, with the line that says why ("onnx-int8: -0.0007 [-0.0015, +0.0001] vs minilm,
margin 0.002; 2.3x cheaper"). A candidate outside the margin is never recommended, however
cheap. Recommending writes nothing: promoting the recommendation is still a promotion.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from registry import entities as e
from registry.costs import Cost

PREFERENCES = ("best", "cheapest")


@dataclass(frozen=True)
class Option:
    """A candidate the recommendation may choose, with its evidence."""

    name: str
    run: e.EvalRun
    cost: Cost | None  # None: its run measured no comparable cost
    unservable: str | None = None  # why the fleet cannot serve it; None: it can
    runtime: str | None = None


def _cost(option: Option) -> str:
    return option.cost.line() if option.cost else "cost not measured"


def recommend(
    task: str,
    options: Sequence[Option],
    *,
    prefer: str,
    margin: float,
    champion: str | None = None,
) -> e.Recommendation:
    if prefer not in PREFERENCES:
        raise ValueError(f"prefer must be one of {', '.join(PREFERENCES)}")
    considered = [f"{o.name}: cannot be served ({o.unservable})" for o in options if o.unservable]
    servable = [o for o in options if o.unservable is None]
    if not servable:
        return e.Recommendation(
            task=task,
            prefer=prefer,
            candidate=None,
            runtime=None,
            reason="no servable candidate has an eval run on the suite version the rule uses",
            considered=considered,
            champion=champion,
        )
    best = max(
        servable, key=lambda o: (o.run.main_score, -(o.cost.price_per_million if o.cost else 0))
    )
    metric = best.run.main_metric
    chosen, reason = best, f"best {metric} {best.run.main_score:.4f} ({_cost(best)})"
    if prefer == "cheapest":
        chosen, reason, lines = _cheapest(best, servable, margin)
        considered += lines
    else:
        considered += [
            f"{o.name}: {metric} {o.run.main_score:.4f} ({_cost(o)})" for o in servable if o != best
        ]
    return e.Recommendation(
        task=task,
        prefer=prefer,
        candidate=chosen.name,
        runtime=chosen.runtime or chosen.run.runtime,
        reason=reason,
        considered=considered,
        champion=champion,
    )


def _cheapest(
    best: Option, servable: Sequence[Option], margin: float
) -> tuple[Option, str, list[str]]:
    """The cheapest of the best and the candidates non-inferior to it, and the lines why."""
    from registry.bootstrap import paired_run_difference

    metric = best.run.main_metric
    lines: list[str] = []
    pool: list[tuple[Option, str]] = []
    for option in servable:
        if option is best:
            continue
        try:
            interval, _ = paired_run_difference(option.run, best.run)
        except ValueError as exc:
            lines.append(f"{option.name}: not comparable with {best.name} ({exc})")
            continue
        said = (
            f"{option.name}: {metric} {interval.estimate:+.4f} "
            f"[{interval.low:+.4f}, {interval.high:+.4f}] vs {best.name}, margin {margin:g}"
        )
        if interval.low <= -margin:
            lines.append(f"{said}: outside the margin")
        elif option.cost is None:
            lines.append(f"{said}: non-inferior, but its cost is not measured (re-run its eval)")
        else:
            pool.append((option, said))
    if best.cost is None:
        return (
            best,
            f"best {metric} {best.run.main_score:.4f}; its cost is not measured, so no "
            "cheaper candidate can be chosen (re-run its eval)",
            lines + [s for _, s in pool],
        )
    cheaper = [
        (o, s) for o, s in pool if o.cost and o.cost.price_per_million < best.cost.price_per_million
    ]
    for option, said in pool:
        if (option, said) not in cheaper:
            lines.append(f"{said}: non-inferior, not cheaper ({_cost(option)})")
    if not cheaper:
        return (
            best,
            f"best {metric} {best.run.main_score:.4f} and no non-inferior candidate is "
            f"cheaper ({_cost(best)})",
            lines,
        )
    cheaper.sort(key=lambda pair: pair[0].cost.price_per_million if pair[0].cost else 0.0)
    (chosen, said), rest = cheaper[0], cheaper[1:]
    assert chosen.cost is not None
    lines += [f"{s}: non-inferior, cheaper, but not the cheapest ({_cost(o)})" for o, s in rest]
    ratio = best.cost.price_per_million / max(chosen.cost.price_per_million, 1e-12)
    return chosen, f"{said}; {ratio:.1f}x cheaper ({_cost(chosen)} vs {_cost(best)})", lines
