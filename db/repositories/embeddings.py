"""Embeddings: one float32 vector per (subgraph, device, encoder, encoder version)."""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db.errors import InvalidRecordError
from db.models import Device, Embedding, Subgraph
from db.repositories._insert import insert_ignore, pages

VECTOR_DTYPE = np.dtype("<f4")


@dataclass(frozen=True)
class EmbeddingIn:
    subgraph_id: int
    device_id: int
    encoder: str
    encoder_version: str
    vector: Sequence[float] | np.ndarray


@dataclass(frozen=True)
class IndexKey:
    """Which embeddings share one vector index: a device class and one version of one encoder."""

    device_class: str
    encoder: str
    encoder_version: str


@dataclass(frozen=True)
class EmbeddingBatch:
    """Embedding rows in id order: ``ids`` (int64), ``vectors`` (float32, n x dim), subgraph ids and kinds."""

    ids: np.ndarray
    vectors: np.ndarray
    subgraph_ids: np.ndarray
    kinds: list[str]


def to_bytes(vector: Sequence[float] | np.ndarray) -> bytes:
    array = np.asarray(vector, dtype=VECTOR_DTYPE)
    if array.ndim != 1 or array.size == 0 or not np.isfinite(array).all():
        raise InvalidRecordError(f"an embedding must be a non-empty finite 1-d vector, got shape {array.shape}")
    return array.tobytes()


def add_embeddings(session: Session, records: Sequence[EmbeddingIn]) -> None:
    """Store embeddings; one that is already stored for its (subgraph, device, encoder, version) is kept."""
    rows = [
        {
            "subgraph_id": r.subgraph_id,
            "device_id": r.device_id,
            "encoder": r.encoder,
            "encoder_version": r.encoder_version,
            "dim": len(r.vector),
            "vector": to_bytes(r.vector),
        }
        for r in records
    ]
    statement = insert_ignore(session, Embedding.__table__, ["subgraph_id", "device_id", "encoder", "encoder_version"])
    for page in pages(rows):
        session.execute(statement, list(page))


def _of_key(key: IndexKey):  # noqa: ANN202 (a SQLAlchemy select)
    return (
        select(Embedding.id, Embedding.vector, Embedding.dim, Embedding.subgraph_id, Subgraph.kind)
        .join(Device, Device.id == Embedding.device_id)
        .join(Subgraph, Subgraph.id == Embedding.subgraph_id)
        .where(
            Device.device_class == key.device_class,
            Embedding.encoder == key.encoder,
            Embedding.encoder_version == key.encoder_version,
        )
    )


def embeddings_after(session: Session, key: IndexKey, after_id: int, batch: int = 50_000) -> Iterator[EmbeddingBatch]:
    """The key's embeddings with id > ``after_id``, in id order, ``batch`` rows at a time."""
    while True:
        rows = session.execute(_of_key(key).where(Embedding.id > after_id).order_by(Embedding.id).limit(batch)).all()
        if not rows:
            return
        dims = {row.dim for row in rows}
        if len(dims) != 1:
            raise InvalidRecordError(f"embeddings of {key} have mixed dimensions {sorted(dims)}")
        yield EmbeddingBatch(
            ids=np.fromiter((row.id for row in rows), dtype=np.int64, count=len(rows)),
            vectors=np.frombuffer(b"".join(row.vector for row in rows), dtype=VECTOR_DTYPE).reshape(len(rows), -1),
            subgraph_ids=np.fromiter((row.subgraph_id for row in rows), dtype=np.int64, count=len(rows)),
            kinds=[row.kind for row in rows],
        )
        after_id = rows[-1].id


def count_through(session: Session, key: IndexKey, last_id: int) -> int:
    """How many of the key's embeddings have id <= ``last_id`` (a watermark check: rows deleted or rewritten)."""
    sub = _of_key(key).where(Embedding.id <= last_id).subquery()
    return session.scalar(select(func.count()).select_from(sub)) or 0
