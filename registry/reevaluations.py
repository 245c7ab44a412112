"""Stale evidence and the queue of re-evaluations that refreshes it.

A pairing (candidate, runtime) is **stale** on a split when it lacks a run through its runtime
on that split of the newest version of the task's suite, while it has evidence it could be
judged by: a run on an older version, or through another runtime (a runtime change), or, for
the champion and the shadow, none at all (what serves must be proven). A new suite version
makes every pairing's runs old at once: a changed folder, or a live split grown by
``live_every`` items (``registry/live_items.py``). ``queue_stale`` puts the stale pairings that
matter into the queue: the champion, the shadow, and the ``challengers`` best challengers of
the version they were last ranked on, each on the test split and on the live split when the
version has one (live splits first). The leading control plane runs the queue one at a time
(``taskfleet/production.py``) and records how each run ended; a failed one is not tried again
on that version (bounded), and one left ``running`` by a control plane that died is queued
again when the next one starts.

Promotion on stale evidence is refused with the line that says how to refresh it
(``registry/promotion_rule.py``, ``stale_refusal``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import case, select
from sqlalchemy.orm import Session

from registry import entities as e
from registry.errors import NotFound
from registry.kinds import BASELINE_KINDS
from registry.models import (
    CandidateRow,
    EvalRunRow,
    ReevaluationRow,
    SuiteRow,
    TaskRow,
    utcnow,
)
from registry.promotion_history import champion_pairing
from registry.rows import get_task_row
from registry.runtimes import DEFAULT_RUNTIME
from registry.shadows import latest_shadow_row
from registry.suite_versions import newest_suite_row
from registry.transactions import Transactions

# Besides the champion and the shadow, this many of the best other candidates are refreshed.
DEFAULT_CHALLENGERS = 2
STATES = ("queued", "running", "done", "failed")


@dataclass(frozen=True)
class Pairing:
    candidate: CandidateRow
    runtime: str
    role: str  # "champion" | "shadow" | "challenger"


class ReevaluationRepository:
    def __init__(self, tx: Transactions) -> None:
        self.tx = tx

    def stale_pairings(
        self, task: str, *, challengers: int = DEFAULT_CHALLENGERS
    ) -> list[e.Staleness]:
        """The pairings whose evidence is stale, with why (the champion and shadow first)."""
        with self.tx.read() as s:
            task_row = get_task_row(s, task)
            suite = newest_suite_row(s, task_row.suite)
            if suite is None:
                return []
            out = []
            for pairing in pairings(s, task_row, suite, challengers):
                reasons = [
                    r
                    for split in splits_of(suite)
                    if (r := stale_reason(s, pairing, suite, split)) is not None
                ]
                if reasons:
                    out.append(
                        e.Staleness(
                            task, pairing.candidate.name, pairing.runtime, pairing.role, reasons
                        )
                    )
            return out

    def queue_stale(
        self, task: str, *, challengers: int = DEFAULT_CHALLENGERS
    ) -> list[e.Reevaluation]:
        """Queue every stale (pairing, split) not queued, run or failed on this version yet;
        returns what was queued now."""
        with self.tx.write(signal=False) as s:
            task_row = get_task_row(s, task)
            suite = newest_suite_row(s, task_row.suite)
            if suite is None:
                return []
            queued = []
            # Live splits first: what production just taught is the news; then the test split.
            for split in reversed(splits_of(suite)):
                for pairing in pairings(s, task_row, suite, challengers):
                    reason = stale_reason(s, pairing, suite, split)
                    if reason is None or _known(s, pairing, suite.fingerprint, split):
                        continue
                    row = ReevaluationRow(
                        task_id=task_row.id,
                        candidate_id=pairing.candidate.id,
                        runtime=pairing.runtime,
                        suite_fingerprint=suite.fingerprint,
                        split=split,
                        reason=f"{pairing.role}: {reason}",
                        state="queued",
                    )
                    s.add(row)
                    s.flush()
                    queued.append(reevaluation_entity(s, row))
            if queued:
                self.tx.audit(
                    s,
                    "reeval.queue",
                    "task",
                    task,
                    {"queued": [f"{r.candidate}/{r.split}" for r in queued]},
                )
            return queued

    def next_reevaluation(self) -> e.Reevaluation | None:
        """The oldest queued re-evaluation on a live split, else the oldest queued one, marked
        running; None when the queue is empty. Live splits go first across tasks too: one
        task's test-split refresh does not hold up what another task's traffic just taught."""
        with self.tx.write(signal=False) as s:
            live_first = case((SuiteRow.live_split == ReevaluationRow.split, 0), else_=1)
            row = s.scalar(
                select(ReevaluationRow)
                .join(SuiteRow, SuiteRow.fingerprint == ReevaluationRow.suite_fingerprint)
                .where(ReevaluationRow.state == "queued")
                .order_by(live_first, ReevaluationRow.id)
                .limit(1)
            )
            if row is None:
                return None
            row.state = "running"
            row.started_at = utcnow()
            return reevaluation_entity(s, row)

    def finish_reevaluation(
        self, reevaluation_id: int, *, eval_run_id: int | None = None, error: str | None = None
    ) -> e.Reevaluation:
        with self.tx.write(signal=False) as s:
            row = s.get(ReevaluationRow, reevaluation_id)
            if row is None:
                raise NotFound(f"unknown re-evaluation {reevaluation_id}")
            row.state = "failed" if error is not None or eval_run_id is None else "done"
            row.finished_at = utcnow()
            row.eval_run_id = eval_run_id
            row.error = error
            return reevaluation_entity(s, row)

    def requeue_interrupted(self) -> int:
        """Put back in the queue what a control plane left running (it died meanwhile)."""
        with self.tx.write(signal=False) as s:
            rows = list(
                s.scalars(select(ReevaluationRow).where(ReevaluationRow.state == "running"))
            )
            for row in rows:
                row.state, row.started_at = "queued", None
            return len(rows)

    def list_reevaluations(self, task: str, *, limit: int = 50) -> list[e.Reevaluation]:
        """A task's re-evaluations, newest first."""
        with self.tx.read() as s:
            rows = s.scalars(
                select(ReevaluationRow)
                .where(ReevaluationRow.task_id == get_task_row(s, task).id)
                .order_by(ReevaluationRow.id.desc())
                .limit(limit)
            )
            return [reevaluation_entity(s, r) for r in rows]


def splits_of(suite: SuiteRow) -> list[str]:
    return [suite.test_split, *([suite.live_split] if suite.live_split else [])]


def pairings(s: Session, task_row: TaskRow, suite: SuiteRow, challengers: int) -> list[Pairing]:
    """The champion, the shadow, then the best ``challengers`` others that have a model, by
    the main metric of their newest test-split run (on whatever version)."""
    out: list[Pairing] = []
    champion = champion_pairing(s, task_row.id)
    if champion is not None:
        out.append(Pairing(champion[0], champion[1], "champion"))
    shadow = latest_shadow_row(s, task_row.id)
    if shadow is not None and shadow.action == "start":
        cand = s.get(CandidateRow, shadow.candidate_id)
        if cand is not None and all(p.candidate.id != cand.id for p in out):
            out.append(Pairing(cand, shadow.runtime, "shadow"))
    taken = {p.candidate.id for p in out}
    ranked: list[tuple[float, CandidateRow, str]] = []
    for cand in s.scalars(select(CandidateRow).where(CandidateRow.task_id == task_row.id)):
        if cand.id in taken or cand.kind in BASELINE_KINDS or cand.base_model_id is None:
            continue
        run = s.scalar(
            select(EvalRunRow)
            .where(EvalRunRow.candidate_id == cand.id, EvalRunRow.split == suite.test_split)
            .order_by(EvalRunRow.created_at.desc(), EvalRunRow.id.desc())
            .limit(1)
        )
        if run is not None:
            score = float(run.metrics.get(run.main_metric, 0.0))
            ranked.append((score, cand, run.runtime or DEFAULT_RUNTIME))
    ranked.sort(key=lambda t: (-t[0], t[1].name))
    out += [Pairing(c, rt, "challenger") for _, c, rt in ranked[: max(challengers, 0)]]
    return out


def stale_reason(s: Session, pairing: Pairing, suite: SuiteRow, split: str) -> str | None:
    """Why the pairing's evidence on ``split`` of ``suite`` (the newest version) is stale, or
    None when it has a run there through its runtime (or no evidence to be stale at all)."""
    runs = list(
        s.scalars(
            select(EvalRunRow)
            .where(EvalRunRow.candidate_id == pairing.candidate.id)
            .order_by(EvalRunRow.created_at.desc(), EvalRunRow.id.desc())
        )
    )
    here = [r for r in runs if r.suite_fingerprint == suite.fingerprint and r.split == split]
    if any((r.runtime or DEFAULT_RUNTIME) == pairing.runtime for r in here):
        return None
    where = f"{split} split of {suite.name} v{suite.version}"
    if here:
        return f"no run through {pairing.runtime} on the {where} (runtime change)"
    older = [r for r in runs if r.suite_fingerprint != suite.fingerprint]
    if older:
        old = older[0].suite_version
        return f"its newest run is on {suite.name} v{old}, not v{suite.version} ({where})"
    if pairing.role in ("champion", "shadow"):
        return f"no eval run on the {where}"
    return None


def _known(s: Session, pairing: Pairing, fingerprint: str, split: str) -> bool:
    return (
        s.scalar(
            select(ReevaluationRow.id).where(
                ReevaluationRow.candidate_id == pairing.candidate.id,
                ReevaluationRow.runtime == pairing.runtime,
                ReevaluationRow.suite_fingerprint == fingerprint,
                ReevaluationRow.split == split,
            )
        )
        is not None
    )


def reevaluation_entity(s: Session, r: ReevaluationRow) -> e.Reevaluation:
    task = s.get(TaskRow, r.task_id)
    cand = s.get(CandidateRow, r.candidate_id)
    version = s.scalar(
        select(SuiteRow.version).where(SuiteRow.fingerprint == r.suite_fingerprint).limit(1)
    )
    return e.Reevaluation(
        id=r.id,
        task=task.name if task else "?",
        candidate=cand.name if cand else "?",
        runtime=r.runtime,
        suite_fingerprint=r.suite_fingerprint,
        suite_version=version,
        split=r.split,
        reason=r.reason,
        state=r.state,
        created_at=r.created_at,
        started_at=r.started_at,
        finished_at=r.finished_at,
        eval_run_id=r.eval_run_id,
        error=r.error,
    )
