"""runtime profiles: tuned runtime settings per base model and machine class; workers report
the profile they apply

Revision ID: 0011
Revises: 0008
Create Date: 2026-12-02 00:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
# 0009 (verdicts) and 0010 (production) are not on main yet: the chain
# is fixed when they land.
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "runtime_profiles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("base_model_id", sa.Integer(), nullable=False),
        sa.Column("model_sha256", sa.String(length=64), nullable=False),
        sa.Column("machine_class", sa.String(length=255), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("task", sa.String(length=128), nullable=False),
        sa.Column("p99_bound_ms", sa.Float(), nullable=False),
        sa.Column("throughput", sa.Float(), nullable=False),
        sa.Column("default_throughput", sa.Float(), nullable=False),
        sa.Column("sweep", sa.JSON(), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["base_model_id"],
            ["base_models.id"],
            name=op.f("fk_runtime_profiles_base_model_id_base_models"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runtime_profiles")),
        sa.UniqueConstraint(
            "model_sha256", "machine_class", name="uq_runtime_profiles_model_class"
        ),
    )
    with op.batch_alter_table("runtime_profiles") as batch:
        batch.create_index(
            batch.f("ix_runtime_profiles_model_sha256"), ["model_sha256"], unique=False
        )
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("profiles", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("profiles")
    with op.batch_alter_table("runtime_profiles") as batch:
        batch.drop_index(batch.f("ix_runtime_profiles_model_sha256"))
    op.drop_table("runtime_profiles")
