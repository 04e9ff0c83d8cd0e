"""The embedding space in 2-D: stored embeddings of one index key (device class, encoder, version) projected on
their first two principal components, each point with its subgraph's kind and best recipe on that device class."""

from dataclasses import dataclass

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db.models import Device, Embedding, Subgraph
from db.repositories.embeddings import IndexKey, embeddings_after
from db.repositories.rankings import best_recipes

PAGE = 500  # ids per IN (...) query


@dataclass(frozen=True)
class KeyCount:
    key: IndexKey
    embeddings: int


@dataclass(frozen=True)
class MapPoint:
    x: float
    y: float
    kind: str
    subgraph_id: int
    structural_hash: str
    device: str
    recipe: str | None  # the fastest ok recipe on the embedding's device (None: nothing measured ok there)
    median_s: float | None


@dataclass(frozen=True)
class EmbeddingMap:
    key: IndexKey
    total: int  # embeddings stored under the key; at most ``max_points`` of them are drawn
    points: list[MapPoint]
    explained: list[float]  # variance ratio of each axis

    def kinds(self) -> list[str]:
        return sorted({p.kind for p in self.points})


def index_keys(session: Session) -> list[KeyCount]:
    """Every (device class, encoder, version) with embeddings, the largest first."""
    n = func.count()
    rows = session.execute(
        select(Device.device_class, Embedding.encoder, Embedding.encoder_version, n)
        .join(Device, Device.id == Embedding.device_id)
        .group_by(Device.device_class, Embedding.encoder, Embedding.encoder_version)
        .order_by(n.desc(), Device.device_class, Embedding.encoder, Embedding.encoder_version)
    )
    return [KeyCount(IndexKey(c, e, v), int(count)) for c, e, v, count in rows]


def project(vectors: np.ndarray) -> tuple[np.ndarray, list[float]]:
    """Rows of ``vectors`` on their first two principal components (n x 2; zeros where there is no variance)."""
    n, dim = vectors.shape
    out = np.zeros((n, 2))
    if n < 2 or dim < 1:
        return out, []
    centred = vectors.astype(np.float64) - vectors.astype(np.float64).mean(axis=0)
    if not np.any(centred):
        return out, []
    from sklearn.decomposition import PCA  # imported on first use: the dashboard's other pages start faster

    pca = PCA(n_components=min(2, n, dim), svd_solver="full")
    coords = pca.fit_transform(centred)
    out[:, : coords.shape[1]] = coords
    return out, [float(r) for r in pca.explained_variance_ratio_]


def embedding_map(session: Session, key: IndexKey, total: int, *, max_points: int) -> EmbeddingMap:
    """The first ``max_points`` embeddings of ``key`` (by id) projected to 2-D, with rows whose vector is not finite
    left out."""
    batch = next(embeddings_after(session, key, 0, batch=max_points), None)
    if batch is None:
        return EmbeddingMap(key, total, [], [])
    finite = np.isfinite(batch.vectors).all(axis=1)
    ids, vectors = batch.ids[finite], batch.vectors[finite]
    kinds = [k for k, ok in zip(batch.kinds, finite, strict=True) if ok]
    coords, explained = project(vectors)
    rows: dict[int, tuple[int, str, str]] = {}  # embedding id -> device id, device name, structural hash
    wanted = [int(i) for i in ids]
    for page in (wanted[i: i + PAGE] for i in range(0, len(wanted), PAGE)):
        query = (
            select(Embedding.id, Embedding.device_id, Device.name, Subgraph.structural_hash)
            .join(Device, Device.id == Embedding.device_id)
            .join(Subgraph, Subgraph.id == Embedding.subgraph_id)
            .where(Embedding.id.in_(page))
        )
        rows.update((row_id, (device_id, name, digest)) for row_id, device_id, name, digest in session.execute(query))
    subgraphs = [int(s) for s in batch.subgraph_ids[finite]]
    best = {}
    for device_id in sorted({device_id for device_id, _, _ in rows.values()}):
        on_device = [s for i, s in zip(ids, subgraphs, strict=True) if rows[int(i)][0] == device_id]
        best[device_id] = best_recipes(session, device_id=device_id, subgraph_ids=on_device)
    points = []
    for (x, y), row_id, subgraph_id, kind in zip(coords, ids, subgraphs, kinds, strict=True):
        device_id, device, digest = rows[int(row_id)]
        timing = best[device_id].get(subgraph_id)
        points.append(MapPoint(float(x), float(y), kind, subgraph_id, digest, device,
                               timing.recipe if timing else None, timing.median_s if timing else None))
    return EmbeddingMap(key, total, points, explained)
