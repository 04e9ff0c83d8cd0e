"""Tables, as SQLAlchemy 2.0 typed ORM classes. Relationships are not declared: repositories load explicitly.

The IR is stored as validated JSON text and recipes as canonical strings; this layer never parses either.
"""

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# BIGINT on PostgreSQL; INTEGER on SQLite so that the primary key stays the rowid alias (autoincrement).
Id = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, dt.datetime: DateTime(timezone=True)}


class Device(Base):
    """A machine kind that kernels are timed on; ``device_class`` groups devices that share a vector index."""

    __tablename__ = "devices"
    id: Mapped[int] = mapped_column(Id, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    device_class: Mapped[str] = mapped_column(String(100), index=True)
    arch: Mapped[str] = mapped_column(String(100))
    bandwidth_gbps: Mapped[float | None] = mapped_column(Float)
    peak_tflops: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=func.now())


class Model(Base):
    __tablename__ = "models"
    id: Mapped[int] = mapped_column(Id, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    content_hash: Mapped[str] = mapped_column(String(64), unique=True)
    source: Mapped[str | None] = mapped_column(String(500))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=func.now())


class Subgraph(Base):
    __tablename__ = "subgraphs"
    id: Mapped[int] = mapped_column(Id, primary_key=True)
    structural_hash: Mapped[str] = mapped_column(String(64), unique=True)
    family_hash: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    ir_json: Mapped[str] = mapped_column(Text)
    features: Mapped[dict[str, Any] | None]
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=func.now())


class ModelSubgraph(Base):
    """The subgraphs of a model, in partition order (a subgraph may occur more than once)."""

    __tablename__ = "model_subgraphs"
    model_id: Mapped[int] = mapped_column(Id, ForeignKey("models.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    subgraph_id: Mapped[int] = mapped_column(Id, ForeignKey("subgraphs.id"), index=True)


class Recipe(Base):
    __tablename__ = "recipes"
    id: Mapped[int] = mapped_column(Id, primary_key=True)
    canonical: Mapped[str] = mapped_column(String(2000), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=func.now())


class Measurement(Base):
    """One timing of a recipe on a subgraph, keyed by everything that invalidates it (STYLE.md 10)."""

    __tablename__ = "measurements"
    __table_args__ = (
        UniqueConstraint("subgraph_id", "recipe_id", "device_id", "toolchain"),  # also serves per-subgraph lookups
        CheckConstraint(
            "(ok AND error_kind IS NULL AND median_s IS NOT NULL) OR (NOT ok AND error_kind IS NOT NULL)",
            name="ok_or_error",
        ),
    )
    id: Mapped[int] = mapped_column(Id, primary_key=True)
    subgraph_id: Mapped[int] = mapped_column(Id, ForeignKey("subgraphs.id"))
    recipe_id: Mapped[int] = mapped_column(Id, ForeignKey("recipes.id"), index=True)
    device_id: Mapped[int] = mapped_column(Id, ForeignKey("devices.id"))
    toolchain: Mapped[str] = mapped_column(String(200))
    median_s: Mapped[float | None] = mapped_column(Float)
    spread_s: Mapped[float | None] = mapped_column(Float)
    repeats: Mapped[int] = mapped_column(Integer)
    ok: Mapped[bool] = mapped_column(Boolean)
    error_kind: Mapped[str | None] = mapped_column(String(64))
    job_id: Mapped[int | None] = mapped_column(Id, ForeignKey("jobs.id", ondelete="SET NULL"), index=True)
    measured_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=func.now())


class Embedding(Base):
    """A subgraph's performance embedding on a device, by one version of one encoder (float32 little-endian)."""

    __tablename__ = "embeddings"
    __table_args__ = (UniqueConstraint("subgraph_id", "device_id", "encoder", "encoder_version"),)
    id: Mapped[int] = mapped_column(Id, primary_key=True)
    subgraph_id: Mapped[int] = mapped_column(Id, ForeignKey("subgraphs.id"))
    device_id: Mapped[int] = mapped_column(Id, ForeignKey("devices.id"), index=True)
    encoder: Mapped[str] = mapped_column(String(100))
    encoder_version: Mapped[str] = mapped_column(String(50))
    dim: Mapped[int] = mapped_column(Integer)
    vector: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=func.now())


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_status_kind", "status", "kind"),)
    id: Mapped[int] = mapped_column(Id, primary_key=True)
    kind: Mapped[str] = mapped_column(String(50))
    status: Mapped[str] = mapped_column(String(20))
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    result: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[dt.datetime | None]
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=func.now())
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow, onupdate=utcnow, server_default=func.now())
    started_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]
    owner_key_id: Mapped[int | None] = mapped_column(Id, ForeignKey("api_keys.id"), index=True)  # who submitted it
    request_key: Mapped[str | None] = mapped_column(String(64), index=True)  # same model, device, toolchain: same job


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[int] = mapped_column(Id, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[Any]] = mapped_column(default=list)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=func.now())
    last_used_at: Mapped[dt.datetime | None]


class Baseline(Base):
    """A subgraph's eager/vendor time on a device and toolchain: what a plan falls back to, so a hit needs no run."""

    __tablename__ = "baselines"
    __table_args__ = (UniqueConstraint("subgraph_id", "device_id", "toolchain"),)
    id: Mapped[int] = mapped_column(Id, primary_key=True)
    subgraph_id: Mapped[int] = mapped_column(Id, ForeignKey("subgraphs.id"))
    device_id: Mapped[int] = mapped_column(Id, ForeignKey("devices.id"), index=True)
    toolchain: Mapped[str] = mapped_column(String(200))
    eager_s: Mapped[float | None] = mapped_column(Float)  # None: eager PyTorch cannot run it there
    measured_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=func.now())


class Demand(Base):
    """A subgraph a user optimized whose nearest stored neighbour was far: the crawler tunes these first."""

    __tablename__ = "demand"
    __table_args__ = (UniqueConstraint("subgraph_id", "device_id"),)
    id: Mapped[int] = mapped_column(Id, primary_key=True)
    subgraph_id: Mapped[int] = mapped_column(Id, ForeignKey("subgraphs.id"))
    device_id: Mapped[int] = mapped_column(Id, ForeignKey("devices.id"), index=True)
    distance: Mapped[float | None] = mapped_column(Float)  # to the nearest neighbour; None: no neighbour at all
    requests: Mapped[int] = mapped_column(Integer, default=1)
    status: Mapped[str] = mapped_column(String(20), default="open", index=True)  # open | crawled
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=func.now())
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow, onupdate=utcnow, server_default=func.now())
