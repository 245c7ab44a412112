"""workers: heartbeats mirrored from NATS KV `workers` by the fleet watcher

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 16:30:06.707855
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=128), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("loaded", sa.JSON(), nullable=False),
        sa.Column("memory_used", sa.BigInteger(), nullable=False),
        sa.Column("memory_budget", sa.BigInteger(), nullable=False),
        sa.Column("queue_depth", sa.JSON(), nullable=False),
        sa.Column("runtimes", sa.JSON(), nullable=False),
        sa.Column("epochs", sa.JSON(), nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reachable", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
        sa.UniqueConstraint("worker_id", name=op.f("uq_workers_worker_id")),
    )


def downgrade() -> None:
    op.drop_table("workers")
