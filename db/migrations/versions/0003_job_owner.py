"""Jobs get an owner (the API key that submitted them) and a request key (what makes two submissions the same).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("owner_key_id", _ID, nullable=True))
        batch.add_column(sa.Column("request_key", sa.String(length=64), nullable=True))
        batch.create_foreign_key(op.f("fk_jobs_owner_key_id_api_keys"), "api_keys", ["owner_key_id"], ["id"])
        batch.create_index(op.f("ix_jobs_owner_key_id"), ["owner_key_id"])
        batch.create_index(op.f("ix_jobs_request_key"), ["request_key"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index(op.f("ix_jobs_request_key"))
        batch.drop_index(op.f("ix_jobs_owner_key_id"))
        batch.drop_constraint(op.f("fk_jobs_owner_key_id_api_keys"), type_="foreignkey")
        batch.drop_column("request_key")
        batch.drop_column("owner_key_id")
