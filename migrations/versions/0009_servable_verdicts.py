"""base models of other formats (fitted lexical baselines, endpoint models) and task preference

A base model row may be a fitted baseline artifact (``format`` tfidf-lr or bm25) or an endpoint
model (``format`` endpoint: its API as JSON, the probe fingerprint taken at registration, the
watcher's latest probe, a price per million items); NULL is a model folder, as before. A task
prefers the best candidate or the cheapest non-inferior one (``prefer``).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 12:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("base_models") as batch:
        batch.add_column(sa.Column("format", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("endpoint", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("probe_fingerprint", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("price_per_million", sa.Float(), nullable=True))
        batch.add_column(sa.Column("probed_fingerprint", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("probed_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("probe_error", sa.Text(), nullable=True))
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(
            sa.Column("prefer", sa.String(length=16), server_default="best", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("prefer")
    with op.batch_alter_table("base_models") as batch:
        for column in (
            "probe_error",
            "probed_at",
            "probed_fingerprint",
            "price_per_million",
            "probe_fingerprint",
            "endpoint",
            "format",
        ):
            batch.drop_column(column)
