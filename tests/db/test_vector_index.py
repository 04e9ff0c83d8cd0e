import threading
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np
import pytest
from sqlalchemy import delete, select

from db.errors import IndexConfigError, InvalidRecordError
from db.index import IndexConfig, IndexKey, Metric, OpenOutcome, VectorIndex
from db.index.watermark import Watermark
from db.models import Embedding
from db.repositories.embeddings import EmbeddingIn, add_embeddings
from db.session import Database

KEY = IndexKey("cuda:sm_90", "static", "1")
DIM = 16


def _vectors(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def _embed(database: Database, subgraph_ids: list[int], device_id: int, vectors: np.ndarray, version: str = "1"):
    with database.scope() as session:
        add_embeddings(
            session,
            [EmbeddingIn(s, device_id, "static", version, v) for s, v in zip(subgraph_ids, vectors, strict=True)],
        )


@pytest.fixture
def filled(database: Database, seed):
    s = seed(database, 60)
    vectors = _vectors(60)
    _embed(database, s.ids, s.device_id, vectors)
    _embed(database, s.ids[:5], s.device_id, _vectors(5, 9), version="2")  # another index: never mixed in
    return database, s, vectors


def _search(index: VectorIndex, database: Database, query: np.ndarray, k: int, kinds=None):
    with database.sessions() as session:
        result = index.search(session, query, k, kinds=kinds)
        return result.ids, result.distances, [(g.id, g.kind) for g in result.subgraphs]


def test_flat_search_is_exact_and_returns_subgraph_rows(filled, tmp_path: Path) -> None:
    database, s, vectors = filled
    index = VectorIndex.open(database, KEY, tmp_path, IndexConfig())
    assert (index.outcome, index.ntotal) == (OpenOutcome.MISSING, 60)
    query = _vectors(1, 5)[0]
    ids, distances, subgraphs = _search(index, database, query, 5)
    exact = np.argsort(((vectors - query) ** 2).sum(axis=1))[:5]
    assert [sid for sid, _ in subgraphs] == [s.ids[i] for i in exact]
    assert np.allclose(distances, ((vectors[exact] - query) ** 2).sum(axis=1), rtol=1e-4)
    assert ids == [int(i) + 1 for i in exact]  # embedding row ids: rows 1..60 were added in subgraph order


def test_kind_filter_keeps_only_neighbours_of_those_kinds(filled, tmp_path: Path) -> None:
    database, s, vectors = filled
    index = VectorIndex.open(database, KEY, tmp_path, IndexConfig())
    query = vectors[0]
    _, _, subgraphs = _search(index, database, query, 7, kinds={"reduction"})
    wanted = [i for i in np.argsort(((vectors - query) ** 2).sum(axis=1)) if s.kinds[i] == "reduction"][:7]
    assert subgraphs == [(s.ids[i], "reduction") for i in wanted]
    assert _search(index, database, query, 100, kinds={"reduction"})[2] == [
        (s.ids[i], "reduction") for i in np.argsort(((vectors - query) ** 2).sum(axis=1)) if s.kinds[i] == "reduction"
    ]  # fewer than k exist: all 20 come back
    assert _search(index, database, query, 3, kinds={"sparse"})[0] == []


@pytest.mark.parametrize("damage", ["flip", "truncate", "watermark", "folder", "watermark folder", "link"])
def test_a_corrupt_file_is_rebuilt_with_identical_results(filled, tmp_path: Path, damage: str) -> None:
    database, _, _ = filled
    index = VectorIndex.open(database, KEY, tmp_path, IndexConfig())
    queries = _vectors(10, 7)
    before = [_search(index, database, q, 8) for q in queries]
    data = bytearray(index.path.read_bytes())
    if damage == "flip":
        data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
        index.path.write_bytes(bytes(data))
    elif damage == "truncate":
        index.path.write_bytes(bytes(data[: len(data) // 3]))
    elif damage in ("folder", "watermark folder"):  # a folder where the file was: it heals, it does not fail
        path = index.path if damage == "folder" else index.watermark_path
        path.unlink()
        (path / "inside").mkdir(parents=True)
    elif damage == "link":  # a link to a file elsewhere is never read, and what it points to is kept
        elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere.faiss"
        elsewhere.write_bytes(bytes(data))
        index.path.unlink()
        index.path.symlink_to(elsewhere)
    else:
        index.watermark_path.write_text("{not json")
    reopened = VectorIndex.open(database, KEY, tmp_path, IndexConfig())
    assert reopened.outcome is OpenOutcome.CORRUPT
    assert [_search(reopened, database, q, 8) for q in queries] == before
    assert VectorIndex.open(database, KEY, tmp_path, IndexConfig()).outcome is OpenOutcome.LOADED
    assert index.path.is_file() and not index.path.is_symlink() and index.watermark_path.is_file()
    if damage == "link":
        assert (tmp_path.parent / f"{tmp_path.name}-elsewhere.faiss").read_bytes() == bytes(data)


def test_new_embeddings_are_added_incrementally(filled, tmp_path: Path, seed) -> None:
    database, s, _ = filled
    index = VectorIndex.open(database, KEY, tmp_path, IndexConfig())
    extra = seed(database, 70)  # adds subgraphs 60..69
    new = _vectors(10, 3)
    _embed(database, extra.ids[60:], s.device_id, new)
    assert index.sync() == 10 and index.ntotal == 70
    assert Watermark.load(index.watermark_path).count == faiss.read_index(str(index.path)).ntotal == 70  # saved
    assert _search(index, database, new[4], 1)[2][0][0] == extra.ids[64]
    assert index.sync() == 0
    _embed(database, [extra.ids[0]], s.device_id, _vectors(1, 4), version="3")  # another key
    reopened = VectorIndex.open(database, KEY, tmp_path, IndexConfig())
    assert (reopened.outcome, reopened.ntotal, reopened.last_id) == (OpenOutcome.LOADED, 70, index.last_id)


def test_an_index_behind_the_database_catches_up_on_open(filled, tmp_path: Path, seed) -> None:
    database, s, _ = filled
    VectorIndex.open(database, KEY, tmp_path, IndexConfig())
    extra = seed(database, 62)
    _embed(database, extra.ids[60:], s.device_id, _vectors(2, 3))
    reopened = VectorIndex.open(database, KEY, tmp_path, IndexConfig())
    assert (reopened.outcome, reopened.ntotal) == (OpenOutcome.LOADED, 62)


def test_the_catch_up_on_open_is_persisted(filled, tmp_path: Path, seed) -> None:
    database, s, _ = filled
    VectorIndex.open(database, KEY, tmp_path, IndexConfig())
    extra = seed(database, 62)
    _embed(database, extra.ids[60:], s.device_id, _vectors(2, 3))
    reopened = VectorIndex.open(database, KEY, tmp_path, IndexConfig())
    mark = Watermark.load(reopened.watermark_path)
    on_disk = faiss.read_index(str(reopened.path))
    assert mark is not None and (mark.count, mark.last_id, on_disk.ntotal) == (62, reopened.last_id, 62)


@pytest.mark.parametrize(("first", "then"), [(Metric.L2, Metric.IP), (Metric.IP, Metric.L2)])
def test_a_file_of_another_metric_is_rebuilt_not_loaded(filled, tmp_path: Path, first, then) -> None:
    database, s, vectors = filled
    VectorIndex.open(database, KEY, tmp_path, IndexConfig(metric=first))
    reopened = VectorIndex.open(database, KEY, tmp_path, IndexConfig(metric=then))
    assert (reopened.outcome, reopened.ntotal) == (OpenOutcome.STALE, 60)
    query = _vectors(1, 11)[0]
    _, _, subgraphs = _search(reopened, database, query, 5)
    score = -(vectors @ query) if then is Metric.IP else ((vectors - query) ** 2).sum(axis=1)
    assert [sid for sid, _ in subgraphs] == [s.ids[i] for i in np.argsort(score)[:5]]
    assert Watermark.load(reopened.watermark_path).metric == str(then)


def test_deleted_rows_or_a_new_factory_make_the_file_stale(filled, tmp_path: Path) -> None:
    database, s, _ = filled
    VectorIndex.open(database, KEY, tmp_path, IndexConfig())
    hnsw = VectorIndex.open(database, KEY, tmp_path, IndexConfig("HNSW32", search_params="efSearch=64"))
    assert (hnsw.outcome, hnsw.ntotal) == (OpenOutcome.STALE, 60)
    with database.scope() as session:
        session.execute(delete(Embedding).where(Embedding.subgraph_id == s.ids[3]))
    reopened = VectorIndex.open(database, KEY, tmp_path, IndexConfig("HNSW32", search_params="efSearch=64"))
    assert (reopened.outcome, reopened.ntotal) == (OpenOutcome.STALE, 59)


def test_inner_product_metric_ranks_by_dot_product(filled, tmp_path: Path) -> None:
    database, s, vectors = filled
    index = VectorIndex.open(database, KEY, tmp_path, IndexConfig(metric=Metric.IP))
    query = _vectors(1, 11)[0]
    _, distances, subgraphs = _search(index, database, query, 3)
    best = np.argsort(-(vectors @ query))[:3]
    assert [sid for sid, _ in subgraphs] == [s.ids[i] for i in best]
    assert np.allclose(distances, (vectors @ query)[best], rtol=1e-4)


def test_bad_config_and_queries_are_clear_errors(filled, tmp_path: Path) -> None:
    database, _, _ = filled
    with pytest.raises(IndexConfigError, match="invalid FAISS factory string 'Nonsense'"):
        VectorIndex.open(database, KEY, tmp_path, IndexConfig("Nonsense"))
    with pytest.raises(IndexConfigError, match="use 'Flat' or 'HNSW32' for small sets"):
        VectorIndex.open(database, KEY, tmp_path, IndexConfig("IVF256,PQ4"))
    index = VectorIndex.open(database, KEY, tmp_path, IndexConfig())
    with pytest.raises(InvalidRecordError, match="dimension 3"):
        _search(index, database, np.ones(3), 2)
    with pytest.raises(InvalidRecordError, match="k must be >= 1"):
        _search(index, database, np.ones(DIM), 0)


def test_an_empty_slice_gives_an_empty_index(sqlite_database: Database, tmp_path: Path) -> None:
    index = VectorIndex.open(sqlite_database, KEY, tmp_path, IndexConfig())
    assert index.ntotal == 0 and _search(index, sqlite_database, np.ones(DIM), 3) == ([], [], [])


def _start_readers(count: int, rounds: int, search: Callable[[], object]) -> tuple[list[threading.Thread],
                                                                                  list[BaseException]]:
    """``count`` threads each calling ``search`` ``rounds`` times, started; and the list their errors go to."""
    errors: list[BaseException] = []

    def read() -> None:
        try:
            for _ in range(rounds):
                search()
        except BaseException as e:  # noqa: BLE001 (collected and asserted by the test)
            errors.append(e)

    readers = [threading.Thread(target=read) for _ in range(count)]
    for t in readers:
        t.start()
    return readers, errors


def test_readers_search_while_a_writer_adds(filled, tmp_path: Path, seed) -> None:
    database, s, vectors = filled
    index = VectorIndex.open(database, KEY, tmp_path, IndexConfig())
    expected = _search(index, database, vectors[10], 1)[2][0]
    extra = seed(database, 160)
    results: list[tuple[int, str]] = []
    readers, errors = _start_readers(4, 30, lambda: results.append(_search(index, database, vectors[10], 1)[2][0]))
    for chunk in range(5):
        _embed(database, extra.ids[60 + 20 * chunk : 80 + 20 * chunk], s.device_id, _vectors(20, 100 + chunk) + 50)
        index.sync(persist=chunk == 4)
    for t in readers:
        t.join()
    assert errors == [] and len(results) == 120 and set(results) == {expected}
    assert index.ntotal == 160


def test_a_sync_never_waits_for_a_connection_under_the_lock_while_searches_hold_the_pool(filled, tmp_path: Path,
                                                                                         seed) -> None:
    database, s, vectors = filled
    small = Database(database.url, pool_size=2, max_overflow=0, pool_timeout=5)  # searches can hold the whole pool
    index = VectorIndex.open(small, KEY, tmp_path, IndexConfig())
    extra = seed(database, 100)

    def search() -> None:  # as the HTTP search does: a session in use, then the index
        with small.sessions() as session:
            session.execute(select(Embedding.id).limit(1)).all()
            index.search(session, vectors[3], 2)

    readers, errors = _start_readers(6, 40, search)
    for chunk in range(4):
        _embed(database, extra.ids[60 + 10 * chunk : 70 + 10 * chunk], s.device_id, _vectors(10, 200 + chunk) + 50)
        try:
            index.sync(persist=False)
        except BaseException as e:  # noqa: BLE001 (a pool timeout under the lock: the deadlock, cut short)
            errors.append(e)
    for t in readers:
        t.join(timeout=120)
    small.dispose()
    assert errors == [] and not any(t.is_alive() for t in readers)
    assert index.ntotal == 100
