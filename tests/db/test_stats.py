import numpy as np

from db.repositories.embeddings import EmbeddingIn, add_embeddings
from db.repositories.measurements import MeasurementIn, ingest_measurements
from db.repositories.model_catalog import add_model, model_subgraph_ids
from db.repositories.stats import DeviceCoverage, KindCoverage, coverage
from db.session import Database


def test_coverage_counts_tables_devices_and_kinds(database: Database, seed) -> None:
    s = seed(database, 4)  # kinds: pointwise, reduction, contraction, pointwise
    seed(database, 0, device="a100")
    with database.scope() as session:
        add_model(session, name="m", content_hash="c" * 64, subgraph_hashes=[s.hashes[0], s.hashes[1], s.hashes[0]])
        ingest_measurements(
            session,
            [
                MeasurementIn(s.hashes[0], "r1", "h100", "t", 1.0),
                MeasurementIn(s.hashes[0], "r2", "h100", "t", None, ok=False, error_kind="timeout"),
                MeasurementIn(s.hashes[1], "r1", "h100", "t", None, ok=False, error_kind="timeout"),
                MeasurementIn(s.hashes[2], "r1", "a100", "t", 2.0),
            ],
        )
        add_embeddings(session, [EmbeddingIn(s.ids[0], s.device_id, "static", "1", np.ones(4))])
    with database.scope() as session:
        stats = coverage(session)
    assert stats.tables == {
        "devices": 2, "models": 1, "subgraphs": 4, "model_subgraphs": 3, "recipes": 2, "measurements": 4,
        "embeddings": 1, "jobs": 0, "api_keys": 0, "baselines": 0, "demand": 0,
    }  # fmt: skip
    assert stats.devices == [
        DeviceCoverage("a100", "cuda:sm_90", 1, 1, 1, 0),
        DeviceCoverage("h100", "cuda:sm_90", 3, 1, 2, 1),
    ]
    assert stats.kinds == [
        KindCoverage("contraction", 1, 1, 1),
        KindCoverage("pointwise", 2, 1, 2),
        KindCoverage("reduction", 1, 0, 1),
    ]


def test_models_keep_subgraph_order_and_are_added_once(database: Database, seed) -> None:
    s = seed(database, 3)
    order = [s.hashes[2], s.hashes[0], s.hashes[2]]
    with database.scope() as session:
        first = add_model(session, name="m", content_hash="d" * 64, subgraph_hashes=order)
        again = add_model(session, name="m2", content_hash="d" * 64, subgraph_hashes=[])
        assert again.id == first.id
        assert model_subgraph_ids(session, first.id) == [s.ids[2], s.ids[0], s.ids[2]]
