"""tasks: per-text limits in characters; api_keys: a token-rate quota beside the request rate

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The defaults of registry/limits.py when this revision was written: existing tasks get them.
_TEXT_LIMITS = {"max_text_chars": 32_768, "max_query_chars": 8_192, "max_document_chars": 32_768}


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        for column, default in _TEXT_LIMITS.items():
            batch.add_column(
                sa.Column(column, sa.Integer(), nullable=False, server_default=str(default))
            )
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("token_rate_per_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("token_burst", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("token_burst")
        batch.drop_column("token_rate_per_s")
    with op.batch_alter_table("tasks") as batch:
        for column in reversed(_TEXT_LIMITS):
            batch.drop_column(column)
