"""The vector index: a FAISS cache of one (device class, encoder, encoder version) slice of the embeddings table.

    index = VectorIndex.open(database, IndexKey("cuda:sm_90", "static", "1"), directory, IndexConfig("HNSW32"))
    with database.scope() as session:
        result = index.search(session, vector, k=8, kinds={"reduction"})
    index.sync()   # after new embeddings were committed: adds them and persists

FAISS ids are embedding row ids. The file is persisted with a watermark; ``open`` loads it when it matches the
database and rebuilds it from the database when it is missing, stale or corrupt. The database is the truth.
Searches run concurrently; ``sync`` and rebuilds take the lock alone.
"""

import hashlib
import re
import shutil
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import faiss
import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from db.errors import DbError, IndexConfigError, InvalidRecordError
from db.index.factory import Metric, new_index, set_search_params
from db.index.rwlock import ReadWriteLock
from db.index.watermark import Watermark, sha256, write_atomic
from db.models import Embedding, Subgraph
from db.repositories.embeddings import EmbeddingBatch, IndexKey, count_through, embeddings_after
from db.session import Database

OVERFETCH = 4


@dataclass(frozen=True)
class IndexConfig:
    """How to build and query an index: a FAISS factory string, a metric, and FAISS search parameters."""

    factory: str = "Flat"
    metric: Metric = Metric.L2
    search_params: str = ""  # e.g. "efSearch=256" for HNSW, "nprobe=32" for IVF


class OpenOutcome(StrEnum):
    LOADED = "loaded"  # the file matched the database (new embeddings, if any, were added)
    MISSING = "rebuilt: file missing"
    STALE = "rebuilt: stale (database or config changed)"
    CORRUPT = "rebuilt: file corrupt"


@dataclass(frozen=True)
class SearchResult:
    """Neighbours, nearest first: embedding ids, distances (L2 squared, or inner products) and subgraph rows."""

    ids: list[int]
    distances: list[float]
    subgraphs: list[Subgraph]


class VectorIndex:
    def __init__(self, database: Database, key: IndexKey, directory: Path, config: IndexConfig) -> None:
        self.database, self.key, self.config = database, key, config
        stem = f"{_slug(key.device_class)}--{_slug(key.encoder)}--{_slug(key.encoder_version)}"
        digest = hashlib.sha256(repr((key.device_class, key.encoder, key.encoder_version)).encode()).hexdigest()[:8]
        self.path = Path(directory) / f"{stem}-{digest}.faiss"
        self.watermark_path = self.path.with_suffix(".json")
        self._lock = ReadWriteLock()
        self._index: faiss.Index | None = None
        self._last_id = 0
        self.outcome: OpenOutcome | None = None

    @classmethod
    def open(cls, database: Database, key: IndexKey, directory: Path, config: IndexConfig) -> "VectorIndex":
        """Load the persisted index, or rebuild it from the database; then add embeddings newer than its watermark."""
        index = cls(database, key, directory, config)
        index.path.parent.mkdir(parents=True, exist_ok=True)
        index.outcome = index._load()  # no lock: nothing else holds the index yet
        if index.outcome is not OpenOutcome.LOADED:
            index._rebuild(index._fetch(0))
        elif index._add(index._fetch(index._last_id)):
            index._persist()
        return index

    @property
    def ntotal(self) -> int:
        return 0 if self._index is None else int(self._index.ntotal)

    @property
    def last_id(self) -> int:
        return self._last_id

    def sync(self, *, persist: bool = True) -> int:
        """Add embeddings committed since the last sync; returns how many were added. The database is read before
        the lock is taken: a writer waiting for a connection while searches hold the pool's connections and wait
        for the lock would wait forever."""
        batches = self._fetch(self._last_id)
        with self._lock.writing():
            added = self._add(batches)
            if added and persist:
                self._persist()
            return added

    def rebuild(self) -> None:
        """Build the index again from every embedding in the database, and persist it."""
        batches = self._fetch(0)
        with self._lock.writing():
            self._rebuild(batches)

    def search(
        self, session: Session, vector: np.ndarray, k: int, *, kinds: set[str] | frozenset[str] | None = None
    ) -> SearchResult:
        """The ``k`` nearest embeddings whose subgraph kind is in ``kinds`` (all kinds when ``None``)."""
        if k < 1:
            raise InvalidRecordError(f"k must be >= 1, got {k}")
        query = np.ascontiguousarray(np.asarray(vector, dtype=np.float32).reshape(1, -1))
        fetch = k if kinds is None else k * OVERFETCH
        while True:
            with self._lock.reading():  # the index only: the database is read outside the lock (see sync)
                if self._index is None or self._index.ntotal == 0:
                    return SearchResult([], [], [])
                if query.shape[1] != self._index.d:
                    raise InvalidRecordError(f"query has dimension {query.shape[1]}, the index has {self._index.d}")
                total = self._index.ntotal
                distances, ids = self._index.search(query, min(fetch, total))
            found = [(int(i), float(d)) for i, d in zip(ids[0], distances[0], strict=True) if i >= 0]
            rows = _subgraphs_of(session, [i for i, _ in found], kinds)
            hits = [(i, d) for i, d in found if i in rows][:k]
            if len(hits) == k or fetch >= total:
                break
            fetch *= OVERFETCH
        return SearchResult([i for i, _ in hits], [d for _, d in hits], [rows[i] for i, _ in hits])

    def _load(self) -> OpenOutcome:
        if _clear_non_files(self.path, self.watermark_path):
            return OpenOutcome.CORRUPT
        if not self.path.exists() or not self.watermark_path.exists():
            return OpenOutcome.MISSING
        mark = Watermark.load(self.watermark_path)
        if mark is None:
            return OpenOutcome.CORRUPT
        if (mark.factory, mark.metric) != (self.config.factory, str(self.config.metric)):
            return OpenOutcome.STALE
        data = self.path.read_bytes()
        if sha256(data) != mark.sha256:
            return OpenOutcome.CORRUPT
        try:
            index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
        except RuntimeError:
            return OpenOutcome.CORRUPT
        if index.ntotal != mark.count or index.d != mark.dim:
            return OpenOutcome.CORRUPT
        with self.database.sessions() as session:
            if count_through(session, self.key, mark.last_id) != mark.count:
                return OpenOutcome.STALE
        set_search_params(index, self.config.search_params)
        self._index, self._last_id = index, mark.last_id
        return OpenOutcome.LOADED

    def _rebuild(self, batches: list[EmbeddingBatch]) -> None:
        self._index, self._last_id = None, 0
        if self._add(batches):
            self._persist()
        else:
            self.path.unlink(missing_ok=True)
            self.watermark_path.unlink(missing_ok=True)

    def _fetch(self, after: int) -> list[EmbeddingBatch]:
        with self.database.sessions() as session:
            return list(embeddings_after(session, self.key, after))

    def _add(self, batches: list[EmbeddingBatch]) -> int:
        """Adds the embeddings of ``batches`` the index does not hold yet (another sync may have added some since
        they were read)."""
        if not batches:
            return 0
        ids = np.concatenate([b.ids for b in batches])
        vectors = np.concatenate([b.vectors for b in batches])
        fresh = ids > self._last_id
        ids, vectors = ids[fresh], vectors[fresh]
        if not len(ids):
            return 0
        if self._index is None:
            self._index = new_index(self.config.factory, vectors.shape[1], self.config.metric)
            set_search_params(self._index, self.config.search_params)
        if vectors.shape[1] != self._index.d:
            raise InvalidRecordError(f"embeddings of {self.key} have dimension {vectors.shape[1]}, not {self._index.d}")
        try:
            if not self._index.is_trained:
                self._index.train(vectors)
            self._index.add_with_ids(vectors, ids)
        except RuntimeError as e:
            raise IndexConfigError(
                f"cannot build index {self.config.factory!r} from {len(ids)} vectors ({e}); "
                "use 'Flat' or 'HNSW32' for small sets"
            ) from None
        self._last_id = int(ids[-1])
        return len(ids)

    def _persist(self) -> None:
        if self._index is None:
            raise DbError("nothing to persist: the index is empty")
        data = faiss.serialize_index(self._index).tobytes()
        write_atomic(self.path, data)
        mark = Watermark(
            self._last_id,
            int(self._index.ntotal),
            int(self._index.d),
            self.config.factory,
            str(self.config.metric),
            sha256(data),
        )
        mark.save(self.watermark_path)


def _clear_non_files(*paths: Path) -> bool:
    """Remove what stands where an index file belongs but is not a regular file (a folder, a link): the index is a
    cache of the database, rebuilt after. Whether anything was removed."""
    cleared = False
    for path in paths:
        if path.is_symlink() or (path.exists() and not path.is_file()):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            cleared = True
    return cleared


def _subgraphs_of(session: Session, ids: list[int], kinds: set[str] | frozenset[str] | None) -> dict[int, Subgraph]:
    if not ids:
        return {}
    query = select(Embedding.id, Subgraph).join(Subgraph, Subgraph.id == Embedding.subgraph_id)
    query = query.where(Embedding.id.in_(ids))
    if kinds is not None:
        query = query.where(Subgraph.kind.in_(sorted(kinds)))
    return {embedding_id: subgraph for embedding_id, subgraph in session.execute(query).all()}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:60]
