"""Baselines (eager time per subgraph, device and toolchain) and the crawler's demand queue.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "baselines",
        sa.Column("id", _ID, nullable=False),
        sa.Column("subgraph_id", _ID, nullable=False),
        sa.Column("device_id", _ID, nullable=False),
        sa.Column("toolchain", sa.String(length=200), nullable=False),
        sa.Column("eager_s", sa.Float(), nullable=True),
        sa.Column("measured_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"], name=op.f("fk_baselines_device_id_devices")),
        sa.ForeignKeyConstraint(["subgraph_id"], ["subgraphs.id"], name=op.f("fk_baselines_subgraph_id_subgraphs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_baselines")),
        sa.UniqueConstraint("subgraph_id", "device_id", "toolchain",
                            name=op.f("uq_baselines_subgraph_id_device_id_toolchain")),
    )
    op.create_index(op.f("ix_baselines_device_id"), "baselines", ["device_id"])
    op.create_table(
        "demand",
        sa.Column("id", _ID, nullable=False),
        sa.Column("subgraph_id", _ID, nullable=False),
        sa.Column("device_id", _ID, nullable=False),
        sa.Column("distance", sa.Float(), nullable=True),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"], name=op.f("fk_demand_device_id_devices")),
        sa.ForeignKeyConstraint(["subgraph_id"], ["subgraphs.id"], name=op.f("fk_demand_subgraph_id_subgraphs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_demand")),
        sa.UniqueConstraint("subgraph_id", "device_id", name=op.f("uq_demand_subgraph_id_device_id")),
    )
    op.create_index(op.f("ix_demand_device_id"), "demand", ["device_id"])
    op.create_index(op.f("ix_demand_status"), "demand", ["status"])


def downgrade() -> None:
    op.drop_table("demand")
    op.drop_table("baselines")
