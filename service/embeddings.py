"""Encoders over the database: train one from stored features and cross-applications, embed subgraphs with it,
and keep fitted versions on disk (``EncoderStore``) with one promoted version per encoder name.

A new version's embeddings are written beside the old version's; searches use the promoted version, so the old
one stays queryable until ``promote`` switches to the new one.
"""

import json
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db.models import Device, Embedding, Subgraph
from db.repositories.embeddings import EmbeddingIn, IndexKey, add_embeddings
from embed.encoders import Encoder, create, encoders, load
from service.store import PROFILE_ENCODER, feature_set, transfer_pairs


def fit_encoder(session: Session, name: str, *, device_id: int, subgraph_ids: Sequence[int], backend: str,
                seed: int = 0) -> Encoder:
    """Encoder ``name`` fitted on ``subgraph_ids`` (with their transfer pairs when it learns from them)."""
    kind = encoders.get(name)
    features = feature_set(session, device_id, subgraph_ids, profiled=kind.uses_profile)
    if not kind.learns:
        return create(name).fit(features)
    return create(name, seed=seed).fit(features, transfer_pairs(session, device_id, subgraph_ids, backend))


def embed_subgraphs(session: Session, encoder: Encoder, *, device_id: int, subgraph_ids: Sequence[int]) -> IndexKey:
    """Store ``encoder``'s embeddings of ``subgraph_ids``; returns the index key they belong to."""
    features = feature_set(session, device_id, subgraph_ids, profiled=encoder.uses_profile)
    vectors = encoder.encode(features)
    version = encoder.version
    add_embeddings(session, [EmbeddingIn(i, device_id, encoder.name, version, v)
                             for i, v in zip(subgraph_ids, vectors, strict=True)])
    device_class = session.scalar(select(Device.device_class).where(Device.id == device_id))
    return IndexKey(str(device_class), encoder.name, version)


def profiled_subgraphs(session: Session, device_id: int) -> list[int]:
    """Ids of the subgraphs that have a baseline profile on the device (the ones encoders can embed)."""
    query = (select(Embedding.subgraph_id).join(Subgraph, Subgraph.id == Embedding.subgraph_id)
             .where(Embedding.device_id == device_id, Embedding.encoder == PROFILE_ENCODER)
             .order_by(Embedding.subgraph_id))
    return list(session.scalars(query))


def profile_sources(session: Session, device_id: int) -> list[int]:
    """The device, then the other devices of its class (the same vector index and arch) by how many subgraphs they
    have profiled, most first, those with none left out: where an encoder may be fitted, and whose measured recipes
    a neighbour may lend where it has none on this device."""
    device_class = select(Device.device_class).where(Device.id == device_id).scalar_subquery()
    counts = (select(Embedding.device_id, func.count())
              .join(Device, Device.id == Embedding.device_id)
              .where(Device.device_class == device_class, Device.id != device_id,
                     Embedding.encoder == PROFILE_ENCODER)
              .group_by(Embedding.device_id).order_by(func.count().desc(), Embedding.device_id))
    return [device_id, *(other for other, _ in session.execute(counts))]


class EncoderStore:
    """Fitted encoders as ``DIR/NAME/VERSION.npz``, and ``DIR/NAME/promoted`` naming the version in use."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def _folder(self, name: str) -> Path:
        return self.directory / name.replace("+", "_plus_")

    def save(self, encoder: Encoder) -> Path:
        return encoder.save(self._folder(encoder.name) / f"{encoder.version}.npz")

    def load(self, name: str, version: str | None = None) -> Encoder:
        """Version ``version`` of encoder ``name`` (the promoted one by default)."""
        version = version or self.promoted(name)
        if version is None:
            raise LookupError(f"no promoted version of encoder {name!r}; run `tunebank embed train --encoder {name}`")
        path = self._folder(name) / f"{version}.npz"
        if not path.exists():
            raise LookupError(f"encoder {name!r} has no stored version {version!r}; known: {self.versions(name)}")
        return load(path)

    def versions(self, name: str) -> list[str]:
        return sorted(p.stem for p in self._folder(name).glob("*.npz"))

    def promoted(self, name: str) -> str | None:
        path = self._folder(name) / "promoted"
        return json.loads(path.read_text())["version"] if path.exists() else None

    def promote(self, name: str, version: str) -> None:
        if version not in self.versions(name):
            raise LookupError(f"encoder {name!r} has no stored version {version!r}; known: {self.versions(name)}")
        (self._folder(name) / "promoted").write_text(json.dumps({"version": version}))
