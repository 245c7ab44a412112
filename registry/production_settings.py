"""How each task is watched in production: its sample rate, how long sampled inputs are kept,
what the promotion rule compares (offline, live or both), its drift threshold and window, and
how many labelled items make a new live version of its suite. A task without a row has the
defaults of ``entities.ProductionSettings``.
"""

from __future__ import annotations

import math
from dataclasses import fields, replace

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry import entities as e
from registry.errors import InvalidInput
from registry.models import ProductionSettingsRow, TaskRow, utcnow
from registry.rows import get_task_row
from registry.transactions import Transactions

# Bounds a setting must stay within: a retention beyond the streams' 90 days is not kept.
MAX_RETENTION_DAYS = 90.0
MAX_WINDOW = 100_000


class ProductionSettingsRepository:
    def __init__(self, tx: Transactions) -> None:
        self.tx = tx

    def production_settings(self, task: str) -> e.ProductionSettings:
        with self.tx.read() as s:
            return settings_of(s, get_task_row(s, task))

    def set_production_settings(
        self, task: str, **changes: float | int | str
    ) -> e.ProductionSettings:
        """Change some settings of a task (the others keep their value)."""
        known = {f.name for f in fields(e.ProductionSettings)} - {"task"}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise InvalidInput(f"unknown production setting(s) {', '.join(unknown)}")
        with self.tx.write() as s:
            task_row = get_task_row(s, task)
            settings = check_settings(replace(settings_of(s, task_row), **changes))  # type: ignore[arg-type]
            write_settings(s, task_row, settings)
            self.tx.audit(s, "production.set", "task", task, dict(changes))
            return settings

    def list_production_settings(self) -> list[e.ProductionSettings]:
        with self.tx.read() as s:
            return [settings_of(s, t) for t in s.scalars(select(TaskRow).order_by(TaskRow.name))]


def settings_of(s: Session, task_row: TaskRow) -> e.ProductionSettings:
    row = s.get(ProductionSettingsRow, task_row.id)
    if row is None:
        return e.ProductionSettings(task=task_row.name)
    return e.ProductionSettings(
        task=task_row.name,
        sample_rate=row.sample_rate,
        retention_days=row.retention_days,
        evidence=row.evidence,
        drift_alpha=row.drift_alpha,
        drift_window=row.drift_window,
        live_every=row.live_every,
    )


def write_settings(s: Session, task_row: TaskRow, settings: e.ProductionSettings) -> None:
    """Store ``settings`` (already checked) in the caller's transaction."""
    row = s.get(ProductionSettingsRow, task_row.id)
    if row is None:
        row = ProductionSettingsRow(task_id=task_row.id)
        s.add(row)
    row.sample_rate = settings.sample_rate
    row.retention_days = settings.retention_days
    row.evidence = settings.evidence
    row.drift_alpha = settings.drift_alpha
    row.drift_window = settings.drift_window
    row.live_every = settings.live_every
    row.updated_at = utcnow()


def check_settings(settings: e.ProductionSettings) -> e.ProductionSettings:
    def finite(name: str, value: float, low: float, high: float) -> None:
        if not (isinstance(value, int | float) and math.isfinite(value) and low <= value <= high):
            raise InvalidInput(f"{name} must be a number from {low:g} to {high:g}; got {value!r}")

    finite("the sample rate", settings.sample_rate, 0.0, 1.0)
    finite("the retention (days)", settings.retention_days, 0.0, MAX_RETENTION_DAYS)
    if settings.retention_days <= 0:
        raise InvalidInput("the retention must be above 0 days")
    finite("the drift alpha", settings.drift_alpha, 0.0, 1.0)
    if not 0 < settings.drift_alpha < 1:
        raise InvalidInput("the drift alpha must be between 0 and 1 (exclusive)")
    if settings.evidence not in e.EVIDENCE_KINDS:
        raise InvalidInput(
            f"evidence must be one of {', '.join(e.EVIDENCE_KINDS)}; got {settings.evidence!r}"
        )
    for name in ("drift_window", "live_every"):
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WINDOW:
            raise InvalidInput(f"{name} must be a whole number from 1 to {MAX_WINDOW}")
    return settings
