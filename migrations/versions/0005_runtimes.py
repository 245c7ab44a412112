"""runtimes: the runtime a placement names and an eval run was scored through

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 05:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("placements") as batch:
        batch.add_column(
            sa.Column("runtime", sa.String(length=16), server_default="torch", nullable=False)
        )
    with op.batch_alter_table("eval_runs") as batch:
        batch.add_column(sa.Column("runtime", sa.String(length=16), nullable=True))
    # Every model-backed run so far was scored in-process by PyTorch; bm25 runs have no runtime.
    op.execute(
        "UPDATE eval_runs SET runtime = 'torch' WHERE candidate_id IN "
        "(SELECT id FROM candidates WHERE kind <> 'bm25')"
    )


def downgrade() -> None:
    with op.batch_alter_table("eval_runs") as batch:
        batch.drop_column("runtime")
    with op.batch_alter_table("placements") as batch:
        batch.drop_column("runtime")
