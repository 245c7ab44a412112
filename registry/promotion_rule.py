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

What the runs are scored on is the task's ``evidence`` setting: ``offline`` the suite's test
split (the default), ``live`` its live split (labelled production items, ``registry/
live_items.py``), ``both`` each, and both must pass. Evidence that is stale (a run on an older
suite version or through another runtime, ``registry/reevaluations.py``) never passes: the
verdict says so (``stale``) and how to refresh it.

``judge`` reads only the ``Evidence`` it is given; ``registry/promotions.py`` gathers it from the
database (the runs that rank each contender on the suite version, the champion from the
promotion history, what the models are) and acts on the verdict: a rule not met is promoted
only by an admin's override with a reason, and an unservable pairing never.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from registry import entities as e
from registry.errors import InvalidInput
from registry.kinds import BASELINE_KINDS
from registry.runtimes import DEFAULT_RUNTIME, check_servable

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


@dataclass(frozen=True)
class Contender:
    """A candidate in the comparison, with the run that ranks it on the suite version."""

    name: str
    kind: str
    model: ModelBuild | None  # None: a model-free baseline
    adapter: str | None
    run: e.EvalRun | None  # its ranking run through the runtime in question, if any
    # Why its evidence is stale, when it has no run here but older evidence (None: not stale).
    stale: str | None = None
    live_run: e.EvalRun | None = None  # the same, on the version's live split
    live_stale: str | None = None


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
    evidence: str = "offline"  # the task's: "offline" | "live" | "both"
    live_split: str | None = None  # the version's live split, if it has one
    command: str = ""  # how to refresh a contender's evidence: `taskfleet eval run TASK -c {}`


def judge(evidence: Evidence) -> e.PromotionCheck:
    """The rule's verdict on promoting the challenger (on its runtime), with the numbers, on
    the task's evidence: the test split, the live split, or both (each must pass)."""
    if evidence.evidence == "offline":
        return _judge(evidence, "test")
    if evidence.live_split is None:
        verdict = _judge(evidence, "test")
        where = f"suite {evidence.suite}" if evidence.suite else "its suite"
        return _with(
            verdict,
            passes=False,
            evidence=evidence.evidence,
            reason=f"the task's evidence is {evidence.evidence}, but {where} has no live split "
            "yet (feedback on sampled requests makes one: `taskfleet production cut "
            f"{evidence.task}`)",
        )
    live = _with(_judge(_on_live(evidence), "live"), evidence=evidence.evidence)
    if evidence.evidence == "live":
        return live
    offline = _with(_judge(evidence, "test"), evidence=evidence.evidence)
    if offline.passes and live.passes:
        return _with(offline, reason=f"offline: {offline.reason}; live: {live.reason}")
    failing, which = (offline, "offline") if not offline.passes else (live, "live")
    return _with(failing, passes=False, reason=f"{which}: {failing.reason}")


def _on_live(evidence: Evidence) -> Evidence:
    def live(c: Contender | None) -> Contender | None:
        return replace(c, run=c.live_run, stale=c.live_stale) if c is not None else None

    challenger = live(evidence.challenger)
    assert challenger is not None
    return replace(evidence, challenger=challenger, champion=live(evidence.champion))


def _refresh(evidence: Evidence, who: str, split: str) -> str:
    command = evidence.command.format(who) if evidence.command else ""
    if command and split == "live":
        command += " --split live"
    how = f"refresh it with `{command}`" if command else "evaluate it again"
    return f"{how} (the re-evaluation loop of `taskfleet serve` queues it by itself)"


def _judge(evidence: Evidence, split: str) -> e.PromotionCheck:
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
    if challenger.kind in BASELINE_KINDS:
        return _with(
            verdict, reason=f"a {challenger.kind} candidate has no model to place on the fleet"
        )
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
        missing = (
            f"{challenger.name!r} has no eval run through the {runtime} runtime on the "
            f"{split} split of {where}"
        )
        if challenger.stale is not None:
            return _with(
                verdict,
                stale=True,
                reason=f"{missing}: its evidence is stale ({challenger.stale}); "
                + _refresh(evidence, challenger.name, split),
            )
        return _with(verdict, reason=missing)
    verdict = _with(verdict, main_metric=run.main_metric, challenger_run_id=run.id)
    if champion is None:
        return _with(verdict, passes=True, reason="no champion yet; challenger evaluated")
    champion_run = champion.run
    if champion_run is None:
        missing = (
            f"champion {champion.name!r} has no eval run through "
            f"{evidence.champion_runtime} on suite {evidence.suite}"
        )
        if split != "test":
            missing += f" ({split} split)"
        if champion.stale is not None:
            return _with(
                verdict,
                stale=True,
                reason=f"{missing}: its evidence is stale ({champion.stale}); "
                + _refresh(evidence, champion.name, split),
            )
        return _with(verdict, reason=f"{missing} (evaluate it on the new version first)")
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
    if interval.estimate < margin:
        return _with(
            verdict,
            reason=f"{metric} improves by {interval.estimate:+.4f}, "
            f"less than the task's margin {margin:g}",
        )
    if interval.low <= 0:
        return _with(
            verdict,
            reason=f"the 95% CI of the {metric} difference "
            f"[{interval.low:+.4f}, {interval.high:+.4f}] does not exclude zero",
        )
    return _with(
        verdict,
        passes=True,
        reason=f"{metric} {interval.estimate:+.4f} "
        f"(95% CI [{interval.low:+.4f}, {interval.high:+.4f}], {paired} queries)",
    )


def unservable(contender: Contender, runtime: str, task_kind: str) -> str | None:
    """Why ``runtime`` cannot serve this contender on a task of ``task_kind``, or None."""
    if contender.model is None:
        return "it has no model to place on the fleet"
    try:
        check_servable(
            runtime,
            model=contender.model.name,
            model_runtimes=list(contender.model.runtimes),
            adapter=contender.adapter,
            task_kind=task_kind,
            variant=contender.model.variant,
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
