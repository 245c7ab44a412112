"""Runtime profiles: the runtime settings a sweep found best for one base model (by sha256) on
one machine class (``taskfleet tune``, taskfleet/tune.py).

One row per (model sha256, machine class), replaced by the next tuning; the audit log keeps
what it replaced. Placements carry every profile of their base model (the publisher reads
``profiles_for``) and each worker applies the one of its own machine class, none other. So a
recorded or removed profile reaches running workers, it writes a new placement epoch (kind
``placement``, the reason naming the profile) for every task whose placement serves that model:
the fleet hears of it like of any other placement change, and the history says why.
"""

from __future__ import annotations

import math
import re
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry import entities as e
from registry.errors import InvalidInput, NotFound, PermissionDenied
from registry.models import (
    BaseModelRow,
    CandidateRow,
    PlacementRow,
    RuntimeProfileRow,
    TaskRow,
)
from registry.placements import latest_placement_row, write_epoch
from registry.promotions import PROMOTE_ROLES
from registry.rows import get_model_row
from registry.transactions import Transactions

#: The fp32 engines a torch worker may run a model with (the same weights, the same vectors
#: within 1e-6: the tuner checks before it measures ONNX Runtime).
ENGINES = ("torch", "onnx")
#: "cpu:<processor model> x<usable cores>" or "gpu:<device name>" (serving/machine.py).
MACHINE_CLASS = re.compile(r"^(cpu|gpu):[^\x00-\x1f]{1,240}$")
_LIMITS: dict[str, tuple[float, float]] = {
    "max_batch_tokens": (1, 1 << 24),
    "max_batch_wait_ms": (0, 60_000),
    "intra_op_threads": (1, 1024),
    "runtimes": (1, 64),
    "max_padding": (0.0, 1.0),
}


def check_settings(settings: e.RuntimeSettings) -> e.RuntimeSettings:
    """Refuse knobs no worker could apply (one line naming the knob)."""
    for name, (low, high) in _LIMITS.items():
        value = getattr(settings, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise InvalidInput(f"runtime setting {name} must be a number, not {value!r}")
        if name != "max_padding" and not isinstance(value, int):
            raise InvalidInput(f"runtime setting {name} must be a whole number, not {value!r}")
        if not low <= value <= high:
            raise InvalidInput(f"runtime setting {name} must be within {low:g}..{high:g}")
    if settings.engine is not None and settings.engine not in ENGINES:
        raise InvalidInput(f"unknown engine {settings.engine!r}; known: {', '.join(ENGINES)}")
    return settings


def check_machine_class(machine_class: str) -> str:
    if not MACHINE_CLASS.match(machine_class):
        raise InvalidInput(
            f"machine class {machine_class[:80]!r} must read 'cpu:<model> x<cores>' or "
            "'gpu:<model>' (at most 244 printable characters)"
        )
    return machine_class


class ProfileRepository:
    def __init__(self, tx: Transactions) -> None:
        self.tx = tx

    def record_profile(self, profile: e.ProfileCreate) -> e.RuntimeProfile:
        """Record (or replace) the profile of the model on the machine class, and a placement
        epoch for every task that serves the model, so running workers apply it."""
        self._may_change_placements()
        check_settings(profile.settings)
        check_machine_class(profile.machine_class)
        for name in ("throughput", "default_throughput", "p99_bound_ms"):
            value = getattr(profile, name)
            if not math.isfinite(value) or value < 0:
                raise InvalidInput(f"{name} must be a finite number >= 0, not {value!r}")
        with self.tx.write() as s:
            model = get_model_row(s, profile.model)
            row = s.scalar(
                select(RuntimeProfileRow).where(
                    RuntimeProfileRow.model_sha256 == model.sha256,
                    RuntimeProfileRow.machine_class == profile.machine_class,
                )
            )
            replaced = profile_entity(s, row).settings.changed() if row else None
            if row is None:
                row = RuntimeProfileRow(
                    model_sha256=model.sha256, machine_class=profile.machine_class
                )
                s.add(row)
            row.base_model_id = model.id
            row.settings = profile.settings.changed()
            row.task = profile.task
            row.p99_bound_ms = profile.p99_bound_ms
            row.throughput = profile.throughput
            row.default_throughput = profile.default_throughput
            row.sweep = list(profile.sweep)
            row.actor = self.tx.actor
            s.flush()
            self.tx.audit(
                s,
                "profile.record",
                "runtime_profile",
                f"{model.name}@{profile.machine_class}",
                {"settings": row.settings, "replaced": replaced, "task": profile.task},
            )
            self._announce(s, model, f"runtime profile {row.id} for {profile.machine_class}")
            return profile_entity(s, row)

    def remove_profile(self, model: str, machine_class: str) -> e.RuntimeProfile:
        """Remove it; the model's placements are published again without it."""
        self._may_change_placements()
        with self.tx.write() as s:
            model_row = get_model_row(s, model)
            row = s.scalar(
                select(RuntimeProfileRow).where(
                    RuntimeProfileRow.model_sha256 == model_row.sha256,
                    RuntimeProfileRow.machine_class == machine_class,
                )
            )
            if row is None:
                raise NotFound(f"model {model!r} has no runtime profile for {machine_class!r}")
            removed = profile_entity(s, row)
            s.delete(row)
            s.flush()
            self.tx.audit(
                s, "profile.remove", "runtime_profile", f"{model}@{machine_class}",
                {"settings": removed.settings.changed()},
            )  # fmt: skip
            self._announce(
                s, model_row, f"runtime profile {removed.id} for {machine_class} removed"
            )
            return removed

    def list_profiles(self, model: str | None = None) -> list[e.RuntimeProfile]:
        with self.tx.read() as s:
            query = select(RuntimeProfileRow).order_by(
                RuntimeProfileRow.model_sha256, RuntimeProfileRow.machine_class
            )
            if model is not None:
                query = query.where(
                    RuntimeProfileRow.model_sha256 == get_model_row(s, model).sha256
                )
            return [profile_entity(s, r) for r in s.scalars(query)]

    def profiles_for(self, model_sha256: str) -> list[e.RuntimeProfile]:
        """Every profile of the base model with this sha256 (what its placements carry)."""
        with self.tx.read() as s:
            rows = s.scalars(
                select(RuntimeProfileRow)
                .where(RuntimeProfileRow.model_sha256 == model_sha256)
                .order_by(RuntimeProfileRow.machine_class)
            )
            return [profile_entity(s, r) for r in rows]

    def _may_change_placements(self) -> None:
        if not set(self.tx.roles) & set(PROMOTE_ROLES):
            raise PermissionDenied("recording a runtime profile needs the promoter or admin role")

    def _announce(self, s: Session, model: BaseModelRow, reason: str) -> None:
        """A new epoch, the candidate and everything else unchanged, for every task whose
        newest placement serves a candidate on this base model."""
        for task_row in s.scalars(select(TaskRow).order_by(TaskRow.id)):
            current = latest_placement_row(s, task_row.id)
            if current is None:
                continue
            cand = s.get(CandidateRow, current.candidate_id)
            if cand is None or cand.base_model_id != model.id:
                continue
            row = write_epoch(
                s, task_row, cand, kind="placement", actor=self.tx.actor, reason=reason,
                previous=cand, eval_run_ids=[], runtime=current.runtime,
            )  # fmt: skip
            placement = s.get(PlacementRow, row.placement_id)
            assert placement is not None
            self.tx.audit(
                s, "placement.set", "placement", f"{task_row.name}@{placement.epoch}",
                {"candidate": cand.name, "reason": reason},
            )  # fmt: skip


def settings_from(raw: dict[str, Any]) -> e.RuntimeSettings:
    known = {k: v for k, v in raw.items() if k in e.RuntimeSettings.__dataclass_fields__}
    return e.RuntimeSettings(**known)


def profile_entity(s: Session, r: RuntimeProfileRow) -> e.RuntimeProfile:
    model = s.get(BaseModelRow, r.base_model_id)
    return e.RuntimeProfile(
        id=r.id,
        model=model.name if model else "?",
        model_sha256=r.model_sha256,
        machine_class=r.machine_class,
        settings=settings_from(r.settings),
        task=r.task,
        p99_bound_ms=r.p99_bound_ms,
        throughput=r.throughput,
        default_throughput=r.default_throughput,
        sweep=list(r.sweep),
        actor=r.actor,
        created_at=r.created_at,
    )
