"""model variants: a base model derived from another (ONNX export, int8 quantisation)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 14:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("base_models") as batch:
        batch.add_column(sa.Column("source_model_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("variant", sa.String(length=32), nullable=True))
        batch.create_foreign_key(
            "fk_base_models_source_model_id_base_models",
            "base_models",
            ["source_model_id"],
            ["id"],
        )


def downgrade() -> None:
    with op.batch_alter_table("base_models") as batch:
        batch.drop_constraint("fk_base_models_source_model_id_base_models", type_="foreignkey")
        batch.drop_column("variant")
        batch.drop_column("source_model_id")
