"""Promotion and rollback: the rule, and the one transaction (promotion record + placement).

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
serves only if its score holds. Otherwise only an admin may promote, with a reason. A pairing
the runtime cannot serve (see ``registry.runtimes``) is refused for everyone.

Every placement epoch has a promotion row, of one of four kinds: `promote` (the rule held, or a
first champion with an eval run), `override` (an admin, with a reason), `rollback`, and
`placement` (only pinned/replicas of the champion changed, `update_placement`; the runtime
changes only by promotion, since a runtime switch is evaluated).
"""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import select
from sqlalchemy.orm import Session

from httpapi.errors import ErrorCode
from registry import entities as e
from registry.bootstrap import paired_run_difference
from registry.candidates import CandidateRepository
from registry.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from registry.evalruns import ranking_run_row
from registry.kinds import BASELINE_KINDS
from registry.models import (
    AdapterRow,
    BaseModelRow,
    CandidateRow,
    PlacementRow,
    PromotionRow,
    TaskRow,
)
from registry.placements import (
    CANDIDATE_CHANGES,
    PROMOTION_KINDS,
    check_replicas,
    latest_placement_row,
    placement_entity,
    write_epoch,
)
from registry.rows import candidate_entity, get_candidate_row, get_task_row
from registry.runtimes import DEFAULT_RUNTIME, check_servable
from registry.store import UNSET
from registry.suite_versions import newest_suite_row
from registry.transactions import Transactions

# How far a runtime switch may move the main metric down (nDCG@10 points): the same weights
# through another runtime differ only by float rounding.
RUNTIME_TOLERANCE = 0.001

PROMOTE_ROLES = ("promoter", "admin")
AUTO_PROMOTE_ACTOR = "system:auto-promote"


class PromotionRuleNotMet(InvalidInput):
    code = ErrorCode.PROMOTION_RULE_NOT_MET


class PromotionRequired(InvalidInput):
    """Only promote, override or rollback change the candidate a task serves."""

    code = ErrorCode.PROMOTION_REQUIRED


class PromotionRepository:
    def __init__(self, tx: Transactions, candidates: CandidateRepository) -> None:
        self.tx = tx
        self.candidates = candidates

    def champion(self, task: str) -> e.Candidate | None:
        with self.tx.read() as s:
            row = _champion_row(s, get_task_row(s, task).id)
            return candidate_entity(s, row) if row else None

    def list_promotions(self, task: str) -> list[e.Promotion]:
        """The append-only promotion history of a task, newest first."""
        with self.tx.read() as s:
            rows = s.scalars(
                select(PromotionRow)
                .where(PromotionRow.task_id == get_task_row(s, task).id)
                .order_by(PromotionRow.id.desc())
            )
            return [promotion_entity(s, r) for r in rows]

    def check_promotion(
        self, task: str, candidate: str, runtime: str | None = None
    ) -> e.PromotionCheck:
        """Does the rule allow promoting this candidate (on ``runtime``) now? Never writes.

        ``runtime`` None: the runtime of the candidate's latest eval run (what was evaluated).
        """
        with self.tx.read() as s:
            task_row = get_task_row(s, task)
            cand = get_candidate_row(s, task, candidate)
            champion = _champion(s, task_row.id)
            champ, champ_runtime = champion if champion else (None, None)
            verdict = e.PromotionCheck(
                task=task,
                challenger=candidate,
                champion=champ.name if champ else None,
                passes=False,
                reason="",
                margin=task_row.margin,
                champion_runtime=champ_runtime,
            )
            if cand.kind in BASELINE_KINDS:
                return _with(
                    verdict, reason=f"a {cand.kind} candidate has no model to place on the fleet"
                )
            suite = newest_suite_row(s, task_row.suite)
            run = (
                ranking_run_row(s, cand.id, suite.fingerprint, suite.test_split, runtime=runtime)
                if suite
                else None
            )
            runtime = runtime or (run.runtime if run else None) or DEFAULT_RUNTIME
            verdict = _with(verdict, runtime=runtime)
            switch = champ is not None and champ.id == cand.id
            if switch and champ_runtime == runtime:
                return _with(verdict, reason=f"{candidate!r} on {runtime} is already the champion")
            problem = _servable_problem(s, task_row, cand, runtime)
            if problem:
                return _with(verdict, reason=problem)
            if run is None or suite is None:
                where = f"suite {task_row.suite}@{suite.version}" if suite else "its suite"
                return _with(
                    verdict,
                    reason=f"{candidate!r} has no eval run through the {runtime} runtime on the "
                    f"test split of {where}",
                )
            verdict = _with(verdict, main_metric=run.main_metric, challenger_run_id=run.id)
            if champ is None:
                return _with(verdict, passes=True, reason="no champion yet; challenger evaluated")
            champ_run = ranking_run_row(
                s, champ.id, suite.fingerprint, suite.test_split, runtime=champ_runtime
            )
            if champ_run is None:
                return _with(
                    verdict,
                    reason=f"champion {champ.name!r} has no eval run through {champ_runtime} on "
                    f"suite {suite.name}@{suite.version} (evaluate it on the new version first)",
                )
            try:
                interval, paired = paired_run_difference(run, champ_run)
            except ValueError as exc:
                return _with(verdict, reason=str(exc))
            verdict = _with(
                verdict,
                champion_run_id=champ_run.id,
                difference=interval.estimate,
                ci_low=interval.low,
                ci_high=interval.high,
                paired_queries=paired,
            )
            metric = run.main_metric
            if switch:
                moved = f"runtime {champ_runtime} -> {runtime}: {metric} {interval.estimate:+.4f}"
                if interval.estimate < -RUNTIME_TOLERANCE:
                    return _with(
                        verdict,
                        reason=f"{moved}, worse than the runtime tolerance -{RUNTIME_TOLERANCE:g}",
                    )
                return _with(
                    verdict,
                    passes=True,
                    reason=f"{moved} (within -{RUNTIME_TOLERANCE:g}, {paired} queries)",
                )
            builds = _builds_of_one_model(s, cand, champ)
            if builds:
                said = f"{builds}: {metric} {interval.estimate:+.4f}"
                if interval.estimate < -task_row.margin:
                    return _with(
                        verdict,
                        reason=f"{said}, worse than the task's margin -{task_row.margin:g}",
                    )
                return _with(
                    verdict,
                    passes=True,
                    reason=f"{said} (within the task's margin -{task_row.margin:g}, "
                    f"{paired} queries)",
                )
            if interval.estimate < task_row.margin:
                return _with(
                    verdict,
                    reason=f"{metric} improves by {interval.estimate:+.4f}, "
                    f"less than the task's margin {task_row.margin:g}",
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

    def promote(
        self,
        task: str,
        candidate: str,
        *,
        reason: str = "",
        override: bool = False,
        expected_champion: str | None = UNSET,
        pinned: bool | None = None,
        replicas: int | None = None,
        runtime: str | None = None,
    ) -> e.Promotion:
        """Make a candidate (on ``runtime``) champion: promotion record + new placement epoch,
        atomically. ``runtime`` None: the runtime of its latest eval run.

        `expected_champion` guards against stale forms: if the champion changed since the
        caller looked, nothing happens and Conflict is raised. `pinned`/`replicas` set the new
        epoch's placement (default: the previous epoch's; pinned and 1 for a first champion).
        """
        if not set(self.tx.roles) & set(PROMOTE_ROLES):
            raise PermissionDenied("promoting needs the promoter or admin role")
        candidate_kind = self.candidates.get_candidate(task, candidate).kind
        if candidate_kind in BASELINE_KINDS:
            raise InvalidInput(f"a {candidate_kind} candidate has no model to place on the fleet")
        check = self.check_promotion(task, candidate, runtime)
        runtime = check.runtime or DEFAULT_RUNTIME
        with self.tx.read() as s:
            # No override places what the runtime cannot serve: it would fail every request.
            problem = _servable_problem(
                s, get_task_row(s, task), get_candidate_row(s, task, candidate), runtime
            )
        if problem:
            raise InvalidInput(f"cannot promote {candidate!r} on {runtime}: {problem}")
        kind = "promote"
        if not check.passes:
            if check.champion == candidate and check.champion_runtime == runtime:
                raise Conflict(check.reason)
            if not override:
                raise PromotionRuleNotMet(
                    f"cannot promote {candidate!r}: {check.reason}; an admin may override "
                    "with a reason"
                )
            if "admin" not in self.tx.roles:
                raise PermissionDenied("overriding the promotion rule needs the admin role")
            if not reason.strip():
                raise InvalidInput("overriding the promotion rule needs a reason")
            kind = "override"
        run_ids = [i for i in (check.challenger_run_id, check.champion_run_id) if i is not None]
        return self._switch(
            task,
            candidate,
            runtime,
            kind=kind,
            reason=reason or check.reason,
            eval_run_ids=run_ids,
            seen_champion=check.champion,
            expected_champion=expected_champion,
            pinned=pinned,
            replicas=replicas,
        )

    def rollback(
        self, task: str, *, reason: str = "", expected_champion: str | None = UNSET
    ) -> e.Promotion:
        """Return the task to the champion before the current one."""
        if not set(self.tx.roles) & set(PROMOTE_ROLES):
            raise PermissionDenied("rolling back needs the promoter or admin role")
        with self.tx.read() as s:
            task_row = get_task_row(s, task)
            last = _latest_promotion(s, task_row.id, CANDIDATE_CHANGES)
            if last is None or last.previous_candidate_id is None:
                raise InvalidInput(f"task {task!r} has no previous champion to roll back to")
            previous = s.get(CandidateRow, last.previous_candidate_id)
            current = s.get(CandidateRow, last.candidate_id)
            assert previous is not None and current is not None
            target, seen = previous.name, current.name
            target_runtime = _previous_runtime(s, last)
        return self._switch(
            task,
            target,
            target_runtime,
            kind="rollback",
            reason=reason or f"rollback from {seen}",
            eval_run_ids=[],
            seen_champion=seen,
            expected_champion=expected_champion,
        )

    def update_placement(
        self,
        task: str,
        *,
        pinned: bool | None = None,
        replicas: int | None = None,
        candidate: str | None = None,
        runtime: str | None = None,
        reason: str = "",
    ) -> e.Placement:
        """Change how the champion is served (pinned, replicas): a new epoch + its history row.

        What is served changes only by promote, override or rollback: naming a `candidate`
        other than the champion, or a `runtime` other than the champion's (a runtime switch is
        evaluated, then promoted), is refused (`PromotionRequired`). A placement that serves
        another candidate than the champion (written before this rule) is put back on the
        champion. Nothing to change: the current placement, no new epoch.
        """
        if not set(self.tx.roles) & set(PROMOTE_ROLES):
            raise PermissionDenied("changing a placement needs the promoter or admin role")
        if replicas is not None:
            check_replicas(replicas)
        with self.tx.write() as s:
            task_row = get_task_row(s, task)
            champion = _champion(s, task_row.id)
            if champion is None:
                raise PromotionRequired(
                    f"task {task!r} has no champion yet: promote a candidate first (its "
                    "eval run backs the placement); then pinned/replicas may change here"
                )
            champ, champ_runtime = champion
            if candidate is not None and candidate != champ.name:
                raise PromotionRequired(
                    f"placing {candidate!r} would change what {task!r} serves (champion: "
                    f"{champ.name!r}); promote it (the rule decides, or an admin overrides with "
                    "a reason) or roll back"
                )
            if runtime is not None and runtime != champ_runtime:
                raise PromotionRequired(
                    f"serving {task!r} through {runtime} instead of {champ_runtime} is a runtime "
                    f"switch: score {champ.name!r} through {runtime} (`taskfleet eval run "
                    f"--runtime {runtime}`) and promote it with `--runtime {runtime}`"
                )
            current = latest_placement_row(s, task_row.id)
            assert current is not None  # a champion always has its placement epoch
            pinned = current.pinned if pinned is None else pinned
            replicas = current.replicas if replicas is None else replicas
            if (current.candidate_id, current.runtime, current.pinned, current.replicas) == (
                champ.id,
                champ_runtime,
                pinned,
                replicas,
            ):
                return placement_entity(s, current)
            placed = s.get(CandidateRow, current.candidate_id)
            changes = _placement_changes(current, pinned, replicas)
            if current.candidate_id != champ.id and placed is not None:
                changes.append(f"back on the champion from {placed.name}")
            if current.runtime != champ_runtime:
                changes.append(f"back on the champion's runtime {champ_runtime}")
            row = write_epoch(
                s,
                task_row,
                champ,
                kind="placement",
                actor=self.tx.actor,
                reason=reason.strip() or "; ".join(changes),
                previous=placed,
                eval_run_ids=[],
                pinned=pinned,
                replicas=replicas,
                runtime=champ_runtime,
            )
            placement = s.get(PlacementRow, row.placement_id)
            assert placement is not None
            self.tx.audit(
                s,
                "placement.set",
                "placement",
                f"{task}@{placement.epoch}",
                {
                    "candidate": champ.name,
                    "runtime": champ_runtime,
                    "pinned": pinned,
                    "replicas": replicas,
                },
            )
            return placement_entity(s, placement)

    def _switch(
        self,
        task: str,
        candidate: str,
        runtime: str,
        *,
        kind: str,
        reason: str,
        eval_run_ids: list[int],
        seen_champion: str | None,
        expected_champion: str | None,
        pinned: bool | None = None,
        replicas: int | None = None,
    ) -> e.Promotion:
        with self.tx.write() as s:
            task_row = get_task_row(s, task)
            cand = get_candidate_row(s, task, candidate)
            champion = _champion(s, task_row.id)
            champ, champ_runtime = champion if champion else (None, None)
            now = champ.name if champ else None
            if expected_champion != UNSET and now != expected_champion:
                raise Conflict(
                    f"the champion of {task!r} changed meanwhile (now {now or 'none'}); "
                    "reload and try again"
                )
            if now != seen_champion:
                raise Conflict(f"the champion of {task!r} changed while checking; try again")
            if champ is not None and champ.id == cand.id and champ_runtime == runtime:
                raise Conflict(f"{candidate!r} on {runtime} is already the champion")
            row = write_epoch(
                s,
                task_row,
                cand,
                kind=kind,
                actor=self.tx.actor,
                reason=reason,
                previous=champ,
                eval_run_ids=eval_run_ids,
                pinned=pinned,
                replicas=replicas,
                runtime=runtime,
            )
            entity = promotion_entity(s, row)
            self.tx.audit(
                s,
                f"task.{kind}",
                "task",
                task,
                {
                    "candidate": candidate,
                    "runtime": runtime,
                    "previous": now,
                    "previous_runtime": champ_runtime,
                    "epoch": entity.epoch,
                },
            )
            return entity

    def maybe_auto_promote(self, task: str, candidate: str) -> e.Promotion | None:
        """After a new eval run: promote as the system if the task opted in and the rule holds."""
        if not self.get_task_auto_promote(task):
            return None
        check = self.check_promotion(task, candidate)
        # Moving the champion to another runtime is an operator's decision, never automatic.
        if not check.passes or check.champion == candidate:
            return None
        system = PromotionRepository(
            self.tx.acting_as(AUTO_PROMOTE_ACTOR, ("promoter",)), self.candidates
        )
        try:
            return system.promote(task, candidate, reason="auto-promotion: rule met")
        except Conflict:
            return None  # someone else promoted in between; their record stands

    def get_task_auto_promote(self, task: str) -> bool:
        with self.tx.read() as s:
            return get_task_row(s, task).auto_promote


def _with(check: e.PromotionCheck, **changes: object) -> e.PromotionCheck:
    return replace(check, **changes)  # type: ignore[arg-type]


def _latest_promotion(
    s: Session, task_id: int, kinds: tuple[str, ...] = PROMOTION_KINDS
) -> PromotionRow | None:
    return s.scalar(
        select(PromotionRow)
        .where(PromotionRow.task_id == task_id, PromotionRow.kind.in_(kinds))
        .order_by(PromotionRow.id.desc())
        .limit(1)
    )


def _placement_changes(current: PlacementRow, pinned: bool, replicas: int) -> list[str]:
    changes = []
    if pinned != current.pinned:
        changes.append("pinned" if pinned else "lazy (no longer pinned)")
    if replicas != current.replicas:
        changes.append(f"replicas {current.replicas} -> {replicas}")
    return changes


def _champion_row(s: Session, task_id: int) -> CandidateRow | None:
    last = _latest_promotion(s, task_id)
    return s.get(CandidateRow, last.candidate_id) if last else None


def _promotion_runtime(s: Session, promotion: PromotionRow) -> str:
    placement = s.get(PlacementRow, promotion.placement_id)
    return placement.runtime if placement else DEFAULT_RUNTIME


def _champion(s: Session, task_id: int) -> tuple[CandidateRow, str] | None:
    """The champion pairing: the latest promotion's candidate and the runtime it placed."""
    last = _latest_promotion(s, task_id)
    if last is None:
        return None
    cand = s.get(CandidateRow, last.candidate_id)
    assert cand is not None
    return cand, _promotion_runtime(s, last)


def _previous_runtime(s: Session, last: PromotionRow) -> str:
    """The runtime of the pairing that was champion before ``last``."""
    before = s.scalar(
        select(PromotionRow)
        .where(PromotionRow.task_id == last.task_id, PromotionRow.id < last.id)
        .order_by(PromotionRow.id.desc())
        .limit(1)
    )
    return _promotion_runtime(s, before) if before else DEFAULT_RUNTIME


def _builds_of_one_model(s: Session, cand: CandidateRow, champ: CandidateRow) -> str | None:
    """How the challenger's model relates to the champion's when both are builds of one model
    (one an optimised variant of the other, or both variants of one source), else None. Such a
    challenger need not beat the champion: it may replace it when it scores no worse than the
    task's margin (a quantised model serves only if its score holds)."""
    if cand.adapter_id is not None or champ.adapter_id is not None:
        return None
    mine = s.get(BaseModelRow, cand.base_model_id) if cand.base_model_id else None
    theirs = s.get(BaseModelRow, champ.base_model_id) if champ.base_model_id else None
    if mine is None or theirs is None or mine.id == theirs.id:
        return None
    if (mine.source_model_id or mine.id) != (theirs.source_model_id or theirs.id):
        return None
    return (
        f"{mine.name} ({mine.variant or 'torch'}) and the champion's {theirs.name} "
        f"({theirs.variant or 'torch'}) are builds of one model"
    )


def _servable_problem(
    s: Session, task_row: TaskRow, cand: CandidateRow, runtime: str
) -> str | None:
    """Why ``runtime`` cannot serve this candidate, or None when it can."""
    base = s.get(BaseModelRow, cand.base_model_id) if cand.base_model_id else None
    if base is None:
        return "it has no model to place on the fleet"
    adapter = s.get(AdapterRow, cand.adapter_id) if cand.adapter_id else None
    try:
        check_servable(
            runtime,
            model=base.name,
            model_runtimes=list(base.runtime_kinds),
            adapter=adapter.name if adapter else None,
            task_kind=task_row.kind,
            variant=base.variant,
        )
    except InvalidInput as exc:
        return str(exc)
    return None


def promotion_entity(s: Session, r: PromotionRow) -> e.Promotion:
    task = s.get(TaskRow, r.task_id)
    cand = s.get(CandidateRow, r.candidate_id)
    prev = s.get(CandidateRow, r.previous_candidate_id) if r.previous_candidate_id else None
    placement = s.get(PlacementRow, r.placement_id)
    if task is None or cand is None or placement is None:
        raise NotFound(f"promotion {r.id} refers to missing rows")
    return e.Promotion(
        r.id,
        task.name,
        cand.name,
        prev.name if prev else None,
        r.kind,
        r.actor,
        r.reason,
        list(r.eval_run_ids),
        placement.epoch,
        r.created_at,
        placement.pinned,
        placement.replicas,
        placement.runtime,
    )
