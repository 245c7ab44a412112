"""Labelled production items: feedback joined to the sampled input it is about.

The control plane (``serving/production_consumer.py``) turns each feedback into one item in the
form the task's suite kind reads (a text and its label; a query, its documents and the relevant
ones; a query and the relevant corpus ids) and keeps it here, once per (request, input). Every
``live_every`` items (a task setting), or on demand, the shell writes a new version of the
task's suite holding all of them as its ``live`` split (``taskfleet/live_split.py``) and marks
the items with the first version that holds them; a live version is a suite version like any
other (fingerprinted, evaluated by ``taskfleet eval run --split live``).
"""

from __future__ import annotations

from sqlalchemy import func, select

from registry import entities as e
from registry.errors import InvalidInput, NotFound
from registry.models import LiveItemRow, SuiteRow, TaskRow
from registry.rows import get_task_row
from registry.transactions import Transactions


class LiveItemRepository:
    def __init__(self, tx: Transactions) -> None:
        self.tx = tx

    def add_live_item(self, item: e.LiveItemCreate) -> e.LiveItem | None:
        """Keep a labelled item; None when that (request, input) already has one (feedback is
        recorded once: a redelivered message changes nothing)."""
        if item.index < 0:
            raise InvalidInput("an input index is 0 or more")
        with self.tx.write(signal=False) as s:
            task_row = get_task_row(s, item.task)
            exists = s.scalar(
                select(LiveItemRow.id).where(
                    LiveItemRow.task_id == task_row.id,
                    LiveItemRow.request_id == item.request_id,
                    LiveItemRow.input_index == item.index,
                )
            )
            if exists is not None:
                return None
            row = LiveItemRow(
                task_id=task_row.id,
                request_id=item.request_id,
                input_index=item.index,
                item=dict(item.item),
                key_name=item.key,
            )
            s.add(row)
            s.flush()
            return live_entity(task_row, row, None)

    def live_items(self, task: str) -> list[e.LiveItem]:
        """Every labelled item of a task, oldest first (what its next live version holds)."""
        with self.tx.read() as s:
            task_row = get_task_row(s, task)
            rows = s.scalars(
                select(LiveItemRow)
                .where(LiveItemRow.task_id == task_row.id)
                .order_by(LiveItemRow.id)
            )
            versions = {r.id: r.version for r in s.scalars(select(SuiteRow))}
            return [live_entity(task_row, r, versions.get(r.suite_version_id or 0)) for r in rows]

    def live_counts(self, task: str) -> tuple[int, int]:
        """(labelled items, of which not in any live version yet)."""
        with self.tx.read() as s:
            task_id = get_task_row(s, task).id
            total = s.scalar(select(func.count()).where(LiveItemRow.task_id == task_id)) or 0
            pending = (
                s.scalar(
                    select(func.count()).where(
                        LiveItemRow.task_id == task_id, LiveItemRow.suite_version_id.is_(None)
                    )
                )
                or 0
            )
            return int(total), int(pending)

    def mark_live_items_cut(self, task: str, item_ids: list[int], suite_version: int) -> int:
        """Note the live version that first holds these items; returns how many were new to
        one."""
        with self.tx.write(signal=False) as s:
            task_row = get_task_row(s, task)
            version = s.scalar(
                select(SuiteRow).where(
                    SuiteRow.name == task_row.suite, SuiteRow.version == suite_version
                )
            )
            if version is None or version.live_split is None:
                raise NotFound(f"suite {task_row.suite!r} has no live version {suite_version}")
            marked = 0
            for row in s.scalars(
                select(LiveItemRow).where(
                    LiveItemRow.task_id == task_row.id,
                    LiveItemRow.id.in_(item_ids),
                    LiveItemRow.suite_version_id.is_(None),
                )
            ):
                row.suite_version_id = version.id
                marked += 1
            self.tx.audit(
                s,
                "live.cut",
                "suite",
                f"{task_row.suite}@{suite_version}",
                {"task": task, "items": len(item_ids), "new": marked},
            )
            return marked


def live_entity(task_row: TaskRow, r: LiveItemRow, version: int | None) -> e.LiveItem:
    return e.LiveItem(
        id=r.id,
        task=task_row.name,
        request_id=r.request_id,
        index=r.input_index,
        item=dict(r.item),
        key=r.key_name,
        received_at=r.received_at,
        suite_version=version,
    )
