"""Tasks: named jobs bound to a registered suite, whose kind they take.

A task is scored on its suite's newest version (``registry/suite_versions.py``); its margin,
``prefer`` (best or cheapest) and ``auto_promote`` are what the promotion rule and the
auto-promotion step read; its per-text limits (``registry/limits.py``) what gateways refuse
above.
"""

from __future__ import annotations

from sqlalchemy import select

from registry import entities as e
from registry.errors import AlreadyExists, InvalidInput, NotFound
from registry.kinds import TASK_KINDS, check_name
from registry.limits import TEXT_LIMIT_DEFAULTS, check_text_limit
from registry.models import TaskRow
from registry.recommendation import PREFERENCES
from registry.rows import get_task_row, task_entity
from registry.suite_versions import newest_suite_row
from registry.transactions import Transactions


def check_preference(prefer: str) -> str:
    if prefer not in PREFERENCES:
        raise InvalidInput(f"prefer must be one of {', '.join(PREFERENCES)}, not {prefer!r}")
    return prefer


class TaskRepository:
    def __init__(self, tx: Transactions) -> None:
        self.tx = tx

    def add_task(
        self,
        name: str,
        *,
        suite: str,
        kind: str | None = None,
        description: str = "",
        owner: str = "",
        margin: float = 0.0,
        auto_promote: bool = False,
        max_text_chars: int | None = None,
        max_query_chars: int | None = None,
        max_document_chars: int | None = None,
        prefer: str = "best",
    ) -> e.Task:
        """Bind a new task to a registered suite; the task has the suite's kind. The
        per-text limits (characters) left out take the defaults of ``registry/limits.py``."""
        check_name("task", name)
        check_preference(prefer)
        if kind is not None and kind not in TASK_KINDS:
            raise InvalidInput(f"unknown task kind {kind!r}; known: {', '.join(TASK_KINDS)}")
        if margin < 0:
            raise InvalidInput("margin must be >= 0")
        given = _checked_limits(max_text_chars, max_query_chars, max_document_chars)
        limits = {**TEXT_LIMIT_DEFAULTS, **given}
        with self.tx.write() as s:
            if s.scalar(select(TaskRow).where(TaskRow.name == name)):
                raise AlreadyExists(f"task {name!r} already exists")
            suite_row = newest_suite_row(s, suite)
            if suite_row is None:
                raise NotFound(
                    f"unknown suite {suite!r}; register it first with `taskfleet suite add "
                    f"{suite} --kind KIND --path DIR`"
                )
            if kind is not None and kind != suite_row.kind:
                raise InvalidInput(
                    f"suite {suite!r} is a {suite_row.kind} suite; task {name!r} cannot be {kind}"
                )
            kind = suite_row.kind
            row = TaskRow(
                name=name,
                kind=kind,
                suite=suite,
                description=description,
                owner=owner,
                margin=margin,
                auto_promote=auto_promote,
                **limits,
                prefer=prefer,
            )
            s.add(row)
            s.flush()
            detail = {"suite": suite, "kind": kind, **limits}
            self.tx.audit(s, "task.add", "task", name, detail)
            return task_entity(row)

    def set_task_limits(
        self,
        name: str,
        *,
        max_text_chars: int | None = None,
        max_query_chars: int | None = None,
        max_document_chars: int | None = None,
    ) -> e.Task:
        """Change the per-text limits (characters) given; the others stay. Gateways apply
        them once the control plane has published them (its next pass, 0.5 s)."""
        changes = _checked_limits(max_text_chars, max_query_chars, max_document_chars)
        if not changes:
            raise InvalidInput(f"give at least one of {', '.join(TEXT_LIMIT_DEFAULTS)} to change")
        with self.tx.write() as s:
            row = get_task_row(s, name)
            previous = {k: getattr(row, k) for k in changes}
            for setting, value in changes.items():
                setattr(row, setting, value)
            self.tx.audit(s, "task.limits", "task", name, {**changes, "previous": previous})
            return task_entity(row)

    def set_task_preference(self, name: str, prefer: str) -> e.Task:
        """What the rule prefers among candidates that hold up: the best, or the cheapest one
        non-inferior within the task's margin (registry/recommendation.py)."""
        check_preference(prefer)
        with self.tx.write() as s:
            row = get_task_row(s, name)
            previous, row.prefer = row.prefer, prefer
            self.tx.audit(s, "task.prefer", "task", name, {"prefer": prefer, "previous": previous})
            return task_entity(row)

    def get_task(self, name: str) -> e.Task:
        with self.tx.read() as s:
            return task_entity(get_task_row(s, name))

    def list_tasks(self) -> list[e.Task]:
        with self.tx.read() as s:
            return [task_entity(r) for r in s.scalars(select(TaskRow).order_by(TaskRow.name))]


def _checked_limits(
    max_text_chars: int | None, max_query_chars: int | None, max_document_chars: int | None
) -> dict[str, int]:
    """The limits given (not None), by setting name, each checked."""
    given = {
        "max_text_chars": max_text_chars,
        "max_query_chars": max_query_chars,
        "max_document_chars": max_document_chars,
    }
    return {k: check_text_limit(k, v) for k, v in given.items() if v is not None}
