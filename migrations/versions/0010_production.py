"""production: shadows, sampled requests, labelled live items, drift windows, re-evaluations

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _fk(table: str, column: str, target: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        [column], [f"{target}.id"], name=op.f(f"fk_{table}_{column}_{target}")
    )


def upgrade() -> None:
    with op.batch_alter_table("suites") as batch:
        batch.add_column(sa.Column("live_split", sa.String(length=64), nullable=True))
    op.create_table(
        "production_settings",
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("sample_rate", sa.Float(), nullable=False),
        sa.Column("retention_days", sa.Float(), nullable=False),
        sa.Column("evidence", sa.String(length=16), nullable=False),
        sa.Column("drift_alpha", sa.Float(), nullable=False),
        sa.Column("drift_window", sa.Integer(), nullable=False),
        sa.Column("live_every", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        _fk("production_settings", "task_id", "tasks"),
        sa.PrimaryKeyConstraint("task_id", name=op.f("pk_production_settings")),
    )
    op.create_table(
        "shadows",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(length=8), nullable=False),
        sa.Column("candidate_id", sa.Integer(), nullable=False),
        sa.Column("runtime", sa.String(length=16), nullable=False),
        sa.Column("sample_rate", sa.Float(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        _fk("shadows", "task_id", "tasks"),
        _fk("shadows", "candidate_id", "candidates"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_shadows")),
        sa.UniqueConstraint("task_id", "epoch", name="uq_shadows_task_epoch"),
    )
    op.create_index(op.f("ix_shadows_task_id"), "shadows", ["task_id"])
    op.create_table(
        "samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("inputs", sa.Integer(), nullable=False),
        sa.Column("champion", sa.String(length=128), nullable=False),
        sa.Column("champion_model_key", sa.Text(), nullable=False),
        sa.Column("champion_epoch", sa.Integer(), nullable=False),
        sa.Column("champion_ms", sa.Float(), nullable=False),
        sa.Column("shadow", sa.String(length=128), nullable=True),
        sa.Column("shadow_outcome", sa.String(length=16), nullable=False),
        sa.Column("shadow_ms", sa.Float(), nullable=True),
        sa.Column("shadow_error", sa.Text(), nullable=True),
        sa.Column("agreement", sa.JSON(), nullable=True),
        sa.Column("agreement_extra", sa.JSON(), nullable=True),
        sa.Column("lengths", sa.JSON(), nullable=False),
        sa.Column("predicted", sa.JSON(), nullable=True),
        sa.Column("vectors", sa.LargeBinary(), nullable=True),
        sa.Column("dims", sa.Integer(), nullable=True),
        _fk("samples", "task_id", "tasks"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_samples")),
        sa.UniqueConstraint("request_id", name=op.f("uq_samples_request_id")),
    )
    op.create_index(op.f("ix_samples_task_id"), "samples", ["task_id"])
    op.create_index(op.f("ix_samples_expires_at"), "samples", ["expires_at"])
    op.create_table(
        "live_items",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("input_index", sa.Integer(), nullable=False),
        sa.Column("item", sa.JSON(), nullable=False),
        sa.Column("key_name", sa.String(length=128), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("suite_version_id", sa.Integer(), nullable=True),
        _fk("live_items", "task_id", "tasks"),
        _fk("live_items", "suite_version_id", "suites"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_live_items")),
        sa.UniqueConstraint("task_id", "request_id", "input_index", name="uq_live_items_input"),
    )
    op.create_index(op.f("ix_live_items_task_id"), "live_items", ["task_id"])
    op.create_table(
        "drift_windows",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("first_sample_id", sa.Integer(), nullable=False),
        sa.Column("last_sample_id", sa.Integer(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("champion", sa.String(length=128), nullable=False),
        sa.Column("suite_version", sa.Integer(), nullable=False),
        sa.Column("signals", sa.JSON(), nullable=False),
        sa.Column("p_min", sa.Float(), nullable=False),
        sa.Column("alpha", sa.Float(), nullable=False),
        sa.Column("drifted", sa.Boolean(), nullable=False),
        _fk("drift_windows", "task_id", "tasks"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_drift_windows")),
    )
    op.create_index(op.f("ix_drift_windows_task_id"), "drift_windows", ["task_id"])
    op.create_table(
        "reevaluations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("candidate_id", sa.Integer(), nullable=False),
        sa.Column("runtime", sa.String(length=16), nullable=True),
        sa.Column("suite_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("split", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("eval_run_id", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        _fk("reevaluations", "task_id", "tasks"),
        _fk("reevaluations", "candidate_id", "candidates"),
        _fk("reevaluations", "eval_run_id", "eval_runs"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reevaluations")),
    )
    op.create_index(op.f("ix_reevaluations_task_id"), "reevaluations", ["task_id"])


def downgrade() -> None:
    for table in ("reevaluations", "drift_windows", "live_items", "samples", "shadows"):
        op.drop_table(table)
    op.drop_table("production_settings")
    with op.batch_alter_table("suites") as batch:
        batch.drop_column("live_split")
