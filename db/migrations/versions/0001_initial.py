"""Initial schema: devices, models, subgraphs, model_subgraphs, recipes, measurements, embeddings, jobs, api_keys.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("scopes", sa.JSON(), nullable=False),
        sa.Column("revoked", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("secret_hash", name=op.f("uq_api_keys_secret_hash")),
    )
    op.create_table(
        "devices",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("device_class", sa.String(length=100), nullable=False),
        sa.Column("arch", sa.String(length=100), nullable=False),
        sa.Column("bandwidth_gbps", sa.Float(), nullable=True),
        sa.Column("peak_tflops", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_devices")),
        sa.UniqueConstraint("name", name=op.f("uq_devices_name")),
    )
    op.create_index(op.f("ix_devices_device_class"), "devices", ["device_class"], unique=False)

    op.create_table(
        "jobs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("kind", sa.String(length=50), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(length=200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    op.create_index("ix_jobs_status_kind", "jobs", ["status", "kind"], unique=False)

    op.create_table(
        "models",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=500), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("content_hash", name=op.f("uq_models_content_hash")),
    )
    op.create_table(
        "recipes",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("canonical", sa.String(length=2000), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_recipes")),
        sa.UniqueConstraint("canonical", name=op.f("uq_recipes_canonical")),
    )
    op.create_table(
        "subgraphs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("structural_hash", sa.String(length=64), nullable=False),
        sa.Column("family_hash", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("ir_json", sa.Text(), nullable=False),
        sa.Column("features", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_subgraphs")),
        sa.UniqueConstraint("structural_hash", name=op.f("uq_subgraphs_structural_hash")),
    )
    op.create_index(op.f("ix_subgraphs_family_hash"), "subgraphs", ["family_hash"], unique=False)
    op.create_index(op.f("ix_subgraphs_kind"), "subgraphs", ["kind"], unique=False)

    op.create_table(
        "embeddings",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("subgraph_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("device_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("encoder", sa.String(length=100), nullable=False),
        sa.Column("encoder_version", sa.String(length=50), nullable=False),
        sa.Column("dim", sa.Integer(), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"], name=op.f("fk_embeddings_device_id_devices")),
        sa.ForeignKeyConstraint(["subgraph_id"], ["subgraphs.id"], name=op.f("fk_embeddings_subgraph_id_subgraphs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_embeddings")),
        sa.UniqueConstraint(
            "subgraph_id",
            "device_id",
            "encoder",
            "encoder_version",
            name=op.f("uq_embeddings_subgraph_id_device_id_encoder_encoder_version"),
        ),
    )
    op.create_index(op.f("ix_embeddings_device_id"), "embeddings", ["device_id"], unique=False)

    op.create_table(
        "measurements",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("subgraph_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("recipe_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("device_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("toolchain", sa.String(length=200), nullable=False),
        sa.Column("median_s", sa.Float(), nullable=True),
        sa.Column("spread_s", sa.Float(), nullable=True),
        sa.Column("repeats", sa.Integer(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("error_kind", sa.String(length=64), nullable=True),
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("measured_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint(
            "(ok AND error_kind IS NULL AND median_s IS NOT NULL) OR (NOT ok AND error_kind IS NOT NULL)",
            name=op.f("ck_measurements_ok_or_error"),
        ),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"], name=op.f("fk_measurements_device_id_devices")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_measurements_job_id_jobs"), ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["recipe_id"], ["recipes.id"], name=op.f("fk_measurements_recipe_id_recipes")),
        sa.ForeignKeyConstraint(["subgraph_id"], ["subgraphs.id"], name=op.f("fk_measurements_subgraph_id_subgraphs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_measurements")),
        sa.UniqueConstraint(
            "subgraph_id",
            "recipe_id",
            "device_id",
            "toolchain",
            name=op.f("uq_measurements_subgraph_id_recipe_id_device_id_toolchain"),
        ),
    )
    op.create_index(op.f("ix_measurements_job_id"), "measurements", ["job_id"], unique=False)
    op.create_index(op.f("ix_measurements_recipe_id"), "measurements", ["recipe_id"], unique=False)

    op.create_table(
        "model_subgraphs",
        sa.Column("model_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("subgraph_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_model_subgraphs_model_id_models"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["subgraph_id"], ["subgraphs.id"], name=op.f("fk_model_subgraphs_subgraph_id_subgraphs")
        ),
        sa.PrimaryKeyConstraint("model_id", "position", name=op.f("pk_model_subgraphs")),
    )
    op.create_index(op.f("ix_model_subgraphs_subgraph_id"), "model_subgraphs", ["subgraph_id"], unique=False)


def downgrade() -> None:
    op.drop_table("model_subgraphs")
    op.drop_table("measurements")
    op.drop_table("embeddings")
    op.drop_table("subgraphs")
    op.drop_table("recipes")
    op.drop_table("models")
    op.drop_table("jobs")
    op.drop_table("devices")
    op.drop_table("api_keys")
