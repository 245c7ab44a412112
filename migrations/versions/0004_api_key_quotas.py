"""api_keys: per-key request-rate quota (token bucket) enforced by the gateway

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 05:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("rate_limit_per_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("rate_burst", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("rate_burst")
        batch.drop_column("rate_limit_per_s")
