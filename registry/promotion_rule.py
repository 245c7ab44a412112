"""The promotion rule: a pure function of its evidence (no database, no session).

What is promoted is a *pairing*: a candidate served by a runtime (torch, candle, http). A
challenger may be promoted when its eval run through that runtime on the newest version of the
task's suite (its test split) beats the champion's run (through the champion's runtime) on that
same version by the task's margin, with the paired-bootstrap lower bound of the difference above
zero. Runs of other suite versions never count. Moving the champion candidate to another runtime
is a promotion too: it needs an eval run through the new runtime whose main metric is no worse
than the serving pairing's by more than ``RUNTIME_TOLERANCE`` (the same model should score the
same). An optimised variant of the champion's model (ONNX, int8; registry/variants.py), or the
champion's source when a variant serves, need not beat it: it may replace it when its main
metric is no worse than the champion's by more than the task's margin, so a quantised model
serves only if its score holds. A pairing the runtime cannot serve (see ``registry.runtimes``)
never passes. The first champion needs only an eval run.

``judge`` reads only the ``Evidence`` it is given; ``registry/promotions.py`` gathers it from the
database (the runs that rank each contender on the suite version, the champion from the
promotion history, what the models are) and acts on the verdict: a rule not met is promoted
only by an admin's override with a reason, and an unservable pairing never.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from registry import entities as e
from registry.costs import Cost, serving_cost
from registry.errors import InvalidInput
from registry.runtimes import DEFAULT_RUNTIME, check_servable

if TYPE_CHECKING:
    from registry.bootstrap import Interval

# How far a runtime switch may move the main metric down (nDCG@10 points): the same weights
# through another runtime differ only by float rounding.
RUNTIME_TOLERANCE = 0.001


@dataclass(frozen=True)
class ModelBuild:
    """What the rule knows of a contender's base model."""

    name: str
    identity: int  # the base model's record
    source: int  # the record of the model it was built from: its own unless it is a variant
    variant: str | None  # onnx, onnx-int8, ...; None for the model as registered
    runtimes: tuple[str, ...]  # the runtimes that may serve it
    format: str | None = None  # a fitted baseline (tfidf-lr, bm25) or "endpoint"; None: weights
    endpoint_kind: str | None = None  # an endpoint model's API: embedding or rerank
    # An endpoint model whose probe no longer answers as at registration: its runs are void.
    stale: bool = False
    price_per_million: float | None = None  # an endpoint model's own price, when given


@dataclass(frozen=True)
class Contender:
    """A candidate in the comparison, with the run that ranks it on the suite version."""

    name: str
    kind: str
    model: ModelBuild | None  # None: a model-free baseline
    adapter: str | None
    run: e.EvalRun | None  # its ranking run through the runtime in question, if any

    @property
    def cost(self) -> Cost | None:
        """What serving a million items costs, from its run (None: not measured)."""
        if self.run is None:
            return None
        price = self.model.price_per_million if self.model else None
        return serving_cost(self.run.cost, endpoint_price_per_million=price)


@dataclass(frozen=True)
class Evidence:
    """Everything the rule reads: the task's terms, the suite version, both contenders."""

    task: str
    task_kind: str
    margin: float
    suite: str | None  # "name@version" of the version runs are compared on; None: no version
    challenger: Contender
    runtime: str | None  # the runtime asked for; None: the one its run was scored through
    champion: Contender | None = None
    champion_runtime: str | None = None
    prefer: str = "best"  # "cheapest": a cheaper challenger non-inferior within the margin passes


def judge(evidence: Evidence) -> e.PromotionCheck:
    """The rule's verdict on promoting the challenger (on its runtime), with the numbers."""
    challenger, champion = evidence.challenger, evidence.champion
    verdict = e.PromotionCheck(
        task=evidence.task,
        challenger=challenger.name,
        champion=champion.name if champion else None,
        passes=False,
        reason="",
        margin=evidence.margin,
        champion_runtime=evidence.champion_runtime,
    )
    if challenger.model is None:
        return _with(verdict, reason=no_model(challenger.kind, evidence.task_kind))
    if challenger.model.stale:
        return _with(verdict, reason=stale_model(challenger.model.name))
    run = challenger.run
    runtime = evidence.runtime or (run.runtime if run else None) or DEFAULT_RUNTIME
    verdict = _with(verdict, runtime=runtime)
    switch = champion is not None and champion.name == challenger.name
    if switch and evidence.champion_runtime == runtime:
        return _with(verdict, reason=f"{challenger.name!r} on {runtime} is already the champion")
    problem = unservable(challenger, runtime, evidence.task_kind)
    if problem:
        return _with(verdict, reason=problem)
    if run is None or evidence.suite is None:
        where = f"suite {evidence.suite}" if evidence.suite else "its suite"
        return _with(
            verdict,
            reason=f"{challenger.name!r} has no eval run through the {runtime} runtime on the "
            f"test split of {where}",
        )
    verdict = _with(verdict, main_metric=run.main_metric, challenger_run_id=run.id)
    if champion is None:
        return _with(verdict, passes=True, reason="no champion yet; challenger evaluated")
    champion_run = champion.run
    if champion_run is None:
        return _with(
            verdict,
            reason=f"champion {champion.name!r} has no eval run through "
            f"{evidence.champion_runtime} on suite {evidence.suite} (evaluate it on the new "
            "version first)",
        )
    # numpy, which the bootstrap needs, loads only when a rule is judged: not for the
    # registry's listings (`taskfleet task ls`).
    from registry.bootstrap import paired_run_difference

    try:
        interval, paired = paired_run_difference(run, champion_run)
    except ValueError as exc:
        return _with(verdict, reason=str(exc))
    verdict = _with(
        verdict,
        champion_run_id=champion_run.id,
        difference=interval.estimate,
        ci_low=interval.low,
        ci_high=interval.high,
        paired_queries=paired,
    )
    metric, margin = run.main_metric, evidence.margin
    if switch:
        moved = (
            f"runtime {evidence.champion_runtime} -> {runtime}: {metric} {interval.estimate:+.4f}"
        )
        if interval.estimate < -RUNTIME_TOLERANCE:
            return _with(
                verdict, reason=f"{moved}, worse than the runtime tolerance -{RUNTIME_TOLERANCE:g}"
            )
        return _with(
            verdict,
            passes=True,
            reason=f"{moved} (within -{RUNTIME_TOLERANCE:g}, {paired} queries)",
        )
    builds = builds_of_one_model(challenger, champion)
    if builds:
        said = f"{builds}: {metric} {interval.estimate:+.4f}"
        if interval.estimate < -margin:
            return _with(verdict, reason=f"{said}, worse than the task's margin -{margin:g}")
        return _with(
            verdict,
            passes=True,
            reason=f"{said} (within the task's margin -{margin:g}, {paired} queries)",
        )
    cheaper = _cheaper(evidence, challenger, champion, interval)
    if cheaper is not None and (interval.estimate < margin or interval.low <= 0):
        return _with(verdict, passes=True, reason=cheaper)
    if interval.estimate < margin:
        return _with(
            verdict,
            reason=f"{metric} improves by {interval.estimate:+.4f}, "
            f"less than the task's margin {margin:g}"
            + _not_cheaper(evidence, challenger, champion, interval),
        )
    if interval.low <= 0:
        return _with(
            verdict,
            reason=f"the 95% CI of the {metric} difference "
            f"[{interval.low:+.4f}, {interval.high:+.4f}] does not exclude zero"
            + _not_cheaper(evidence, challenger, champion, interval),
        )
    return _with(
        verdict,
        passes=True,
        reason=f"{metric} {interval.estimate:+.4f} "
        f"(95% CI [{interval.low:+.4f}, {interval.high:+.4f}], {paired} queries)",
    )


def no_model(kind: str, task_kind: str) -> str:
    """Why a model-free candidate cannot be placed."""
    if kind == "bm25" and task_kind == "retrieval":
        return (
            "BM25 for retrieval makes no embedding, so it cannot serve a retrieval task (it is "
            "scored in the eval only; a bm25 rerank candidate is served)"
        )
    if kind in ("tfidf-lr", "bm25"):
        return (
            f"this {kind} candidate was added without a fitted artifact (before baselines were "
            f"servable): add a fitted one, `taskfleet candidate add TASK --kind {kind} --name "
            f"{kind}-fitted`, evaluate and promote it"
        )
    return f"a {kind} candidate has no model to place on the fleet"


def stale_model(model: str) -> str:
    return (
        f"endpoint model {model!r} no longer answers its probe as when it was registered "
        "(stale): its eval runs do not hold for what it serves now; register it again and "
        "evaluate that"
    )


def _cheaper(
    evidence: Evidence, challenger: Contender, champion: Contender, interval: Interval
) -> str | None:
    """Under ``prefer cheapest``: the reason a challenger non-inferior to the champion within
    the margin (paired CI lower bound above -margin) and cheaper per million items passes."""
    if evidence.prefer != "cheapest" or interval.low <= -evidence.margin:
        return None
    mine, theirs = challenger.cost, champion.cost
    if mine is None or theirs is None or mine.price_per_million >= theirs.price_per_million:
        return None
    assert challenger.run is not None
    ratio = theirs.price_per_million / max(mine.price_per_million, 1e-12)
    return (
        f"{challenger.name}: {challenger.run.main_metric} {interval.estimate:+.4f} "
        f"[{interval.low:+.4f}, {interval.high:+.4f}] vs {champion.name}, margin "
        f"{evidence.margin:g}; {ratio:.1f}x cheaper ({mine.line()} vs {theirs.line()})"
    )


def _not_cheaper(
    evidence: Evidence, challenger: Contender, champion: Contender, interval: Interval
) -> str:
    """What ``prefer cheapest`` adds to a refusal: why the cheaper path did not hold."""
    if evidence.prefer != "cheapest":
        return ""
    if interval.low <= -evidence.margin:
        return f"; not non-inferior either (CI lower bound below -{evidence.margin:g})"
    mine, theirs = challenger.cost, champion.cost
    if mine is None or theirs is None:
        return "; its cost or the champion's is not measured, so cheaper cannot be judged"
    return f"; non-inferior but not cheaper ({mine.line()} vs {theirs.line()})"


def unservable(contender: Contender, runtime: str, task_kind: str) -> str | None:
    """Why ``runtime`` cannot serve this contender on a task of ``task_kind``, or None."""
    if contender.model is None:
        return no_model(contender.kind, task_kind)
    try:
        check_servable(
            runtime,
            model=contender.model.name,
            model_runtimes=list(contender.model.runtimes),
            adapter=contender.adapter,
            task_kind=task_kind,
            variant=contender.model.variant,
            model_format=contender.model.format,
            endpoint_kind=contender.model.endpoint_kind,
        )
    except InvalidInput as exc:
        return str(exc)
    return None


def builds_of_one_model(challenger: Contender, champion: Contender) -> str | None:
    """How the challenger's model relates to the champion's when both are builds of one model
    (one an optimised variant of the other, or both variants of one source), else None. Such a
    challenger need not beat the champion: it may replace it when it scores no worse than the
    task's margin (a quantised model serves only if its score holds)."""
    if challenger.adapter is not None or champion.adapter is not None:
        return None
    mine, theirs = challenger.model, champion.model
    if mine is None or theirs is None or mine.identity == theirs.identity:
        return None
    if mine.source != theirs.source:
        return None
    return (
        f"{mine.name} ({mine.variant or 'torch'}) and the champion's {theirs.name} "
        f"({theirs.variant or 'torch'}) are builds of one model"
    )


def _with(check: e.PromotionCheck, **changes: object) -> e.PromotionCheck:
    return replace(check, **changes)  # type: ignore[arg-type]
