"""Promotion, rollback and placement changes: the act, in one transaction with its records.

The rule (``registry/promotion_rule.py``) is a pure function of its evidence; this module
gathers that evidence from the database (``_evidence``), asks the rule, and writes what the
verdict allows: an append-only promotion row and a new placement epoch, together
(``write_epoch``), in the history of ``registry/promotion_history.py``. A rule not met is
promoted only by an admin's override with a reason; a pairing the runtime cannot serve, never.
The runtime changes only by promotion, since a runtime switch is evaluated; `update_placement`
changes only pinned/replicas of the champion. Auto-promotion (``maybe_auto_promote``) is a step
the caller asks for after recording a run (the eval runner does), never part of recording.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from httpapi.errors import ErrorCode
from registry import entities as e
from registry.errors import Conflict, InvalidInput, PermissionDenied
from registry.evalruns import eval_entity, ranking_run_row
from registry.models import AdapterRow, BaseModelRow, CandidateRow, PlacementRow, SuiteRow
from registry.placements import (
    CANDIDATE_CHANGES,
    check_replicas,
    latest_placement_row,
    placement_entity,
    write_epoch,
)
from registry.promotion_history import (
    champion_pairing,
    latest_promotion,
    previous_runtime,
    promotion_entity,
)
from registry.promotion_rule import (
    Contender,
    Evidence,
    ModelBuild,
    judge,
    no_model,
    stale_model,
    unservable,
)
from registry.recommendation import Option, recommend
from registry.rows import get_candidate_row, get_task_row, model_entity
from registry.runtimes import DEFAULT_RUNTIME
from registry.store import UNSET
from registry.suite_versions import newest_suite_row
from registry.transactions import Transactions

PROMOTE_ROLES = ("promoter", "admin")
AUTO_PROMOTE_ACTOR = "system:auto-promote"


class PromotionRuleNotMet(InvalidInput):
    code = ErrorCode.PROMOTION_RULE_NOT_MET


class PromotionRequired(InvalidInput):
    """Only promote, override or rollback change the candidate a task serves."""

    code = ErrorCode.PROMOTION_REQUIRED


class PromotionRepository:
    def __init__(self, tx: Transactions) -> None:
        self.tx = tx

    def recommend(self, task: str) -> e.Recommendation:
        """What the task should serve under its preference, and why (never writes)."""
        with self.tx.read() as s:
            return _recommendation(s, task)

    def check_promotion(
        self, task: str, candidate: str, runtime: str | None = None
    ) -> e.PromotionCheck:
        """Does the rule allow promoting this candidate (on ``runtime``) now? Never writes.

        ``runtime`` None: the runtime of the candidate's latest eval run (what was evaluated).
        """
        with self.tx.read() as s:
            evidence = _evidence(s, task, candidate, runtime)
        return judge(evidence)

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
        with self.tx.read() as s:
            evidence = _evidence(s, task, candidate, runtime)
        challenger = evidence.challenger
        if challenger.model is None:
            raise InvalidInput(
                f"cannot promote {candidate!r}: {no_model(challenger.kind, evidence.task_kind)}"
            )
        check = judge(evidence)
        runtime = check.runtime or DEFAULT_RUNTIME
        # No override places what the runtime cannot serve: it would fail every request.
        problem = unservable(challenger, runtime, evidence.task_kind)
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
            last = latest_promotion(s, task_row.id, CANDIDATE_CHANGES)
            if last is None or last.previous_candidate_id is None:
                raise InvalidInput(f"task {task!r} has no previous champion to roll back to")
            previous = s.get(CandidateRow, last.previous_candidate_id)
            current = s.get(CandidateRow, last.candidate_id)
            assert previous is not None and current is not None
            target, seen = previous.name, current.name
            target_runtime = previous_runtime(s, last)
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
            champion = champion_pairing(s, task_row.id)
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
            champion = champion_pairing(s, task_row.id)
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
        system = PromotionRepository(self.tx.acting_as(AUTO_PROMOTE_ACTOR, ("promoter",)))
        try:
            return system.promote(task, candidate, reason="auto-promotion: rule met")
        except Conflict:
            return None  # someone else promoted in between; their record stands

    def get_task_auto_promote(self, task: str) -> bool:
        with self.tx.read() as s:
            return get_task_row(s, task).auto_promote


def _evidence(s: Session, task: str, candidate: str, runtime: str | None) -> Evidence:
    """What the rule reads: the task's terms, the newest version of its suite, and the runs
    that rank the challenger (through ``runtime``, or any) and the champion (through its
    serving runtime) on that version's test split."""
    task_row = get_task_row(s, task)
    cand = get_candidate_row(s, task, candidate)
    champion = champion_pairing(s, task_row.id)
    champ, champ_runtime = champion if champion else (None, None)
    suite = newest_suite_row(s, task_row.suite)

    def contender(row: CandidateRow, through: str | None) -> Contender:
        return _contender(s, row, suite, through)

    return Evidence(
        task=task,
        task_kind=task_row.kind,
        margin=task_row.margin,
        suite=f"{suite.name}@{suite.version}" if suite else None,
        challenger=contender(cand, runtime),
        runtime=runtime,
        champion=contender(champ, champ_runtime) if champ else None,
        champion_runtime=champ_runtime,
        prefer=task_row.prefer,
    )


def _contender(
    s: Session, row: CandidateRow, suite: SuiteRow | None, through: str | None
) -> Contender:
    """A candidate with its ranking run on ``suite``'s test split (through ``through``, or the
    newest through any runtime) and what its model is."""
    run = (
        ranking_run_row(s, row.id, suite.fingerprint, suite.test_split, runtime=through)
        if suite
        else None
    )
    base = s.get(BaseModelRow, row.base_model_id) if row.base_model_id else None
    adapter = s.get(AdapterRow, row.adapter_id) if row.adapter_id else None
    model = None
    if base is not None:
        entity = model_entity(s, base)
        model = ModelBuild(
            base.name,
            base.id,
            base.source_model_id or base.id,
            base.variant,
            tuple(base.runtime_kinds),
            format=base.format,
            endpoint_kind=(base.endpoint or {}).get("kind"),
            stale=entity.stale,
            price_per_million=base.price_per_million,
        )
    return Contender(
        row.name,
        row.kind,
        model,
        adapter.name if adapter else None,
        eval_entity(s, run) if run else None,
    )


def _recommendation(s: Session, task: str) -> e.Recommendation:
    """Every candidate's ranking run on the newest suite version, its cost and whether the
    fleet can serve it, handed to the pure choice of registry/recommendation.py."""
    task_row = get_task_row(s, task)
    suite = newest_suite_row(s, task_row.suite)
    champion = champion_pairing(s, task_row.id)
    options: list[Option] = []
    rows = s.scalars(
        select(CandidateRow).where(CandidateRow.task_id == task_row.id).order_by(CandidateRow.id)
    )
    for row in rows:
        contender = _contender(s, row, suite, None)
        if contender.run is None:
            continue
        runtime = contender.run.runtime or DEFAULT_RUNTIME
        problem = unservable(contender, runtime, task_row.kind)
        if problem is None and contender.model is not None and contender.model.stale:
            problem = stale_model(contender.model.name)
        options.append(Option(row.name, contender.run, contender.cost, problem, runtime))
    return recommend(
        task,
        options,
        prefer=task_row.prefer,
        margin=task_row.margin,
        champion=champion[0].name if champion else None,
    )


def _placement_changes(current: PlacementRow, pinned: bool, replicas: int) -> list[str]:
    changes = []
    if pinned != current.pinned:
        changes.append("pinned" if pinned else "lazy (no longer pinned)")
    if replicas != current.replicas:
        changes.append(f"replicas {current.replicas} -> {replicas}")
    return changes
