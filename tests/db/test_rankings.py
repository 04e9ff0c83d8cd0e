from db.repositories.measurements import MeasurementIn, ingest_measurements
from db.repositories.rankings import best_recipes, recipe_outcomes, top_k_recipes
from db.session import Database


def _ingest(database: Database, rows: list[tuple[str, str, str, float | None]]) -> None:
    records = [
        MeasurementIn(h, r, "h100", tc, m, 0.1, 5)
        if m is not None
        else MeasurementIn(h, r, "h100", tc, None, None, 0, False, "wrong_result")
        for h, r, tc, m in rows
    ]
    with database.scope() as session:
        ingest_measurements(session, records)


def test_best_and_top_k_rank_ok_measurements_by_median(database: Database, seed) -> None:
    s = seed(database, 3)
    a, b, c = s.hashes
    _ingest(
        database,
        [
            (a, "r1", "t1", 3.0),
            (a, "r2", "t1", 1.0),
            (a, "r3", "t1", 2.0),
            (a, "r4", "t1", None),
            (a, "r3", "t2", 0.5),  # the same recipe under another toolchain: counted once, at its best
            (b, "r1", "t1", 5.0),
            (b, "r2", "t1", None),
            (c, "r1", "t1", None),  # only failures: no best recipe
        ],
    )
    with database.scope() as session:
        best = best_recipes(session, device_id=s.device_id, subgraph_ids=s.ids)
        top = top_k_recipes(session, subgraph_id=s.ids[0], device_id=s.device_id, k=3)
        top_t1 = top_k_recipes(session, subgraph_id=s.ids[0], device_id=s.device_id, k=10, toolchain="t1")
    assert {sid: (t.recipe, t.median_s, t.toolchain) for sid, t in best.items()} == {
        s.ids[0]: ("r3", 0.5, "t2"),
        s.ids[1]: ("r1", 5.0, "t1"),
    }
    assert [(t.recipe, t.median_s) for t in top] == [("r3", 0.5), ("r2", 1.0), ("r1", 3.0)]
    assert [(t.recipe, t.median_s) for t in top_t1] == [("r2", 1.0), ("r3", 2.0), ("r1", 3.0)]


def test_ties_are_broken_by_recipe_id(database: Database, seed) -> None:
    s = seed(database, 1)
    _ingest(database, [(s.hashes[0], "first", "t", 1.0), (s.hashes[0], "second", "t", 1.0)])
    with database.scope() as session:
        best = best_recipes(session, device_id=s.device_id, subgraph_ids=s.ids)
    assert best[s.ids[0]].recipe == "first"


def test_recipe_outcomes_span_subgraphs_with_their_kinds(database: Database, seed) -> None:
    s = seed(database, 3)
    _ingest(database, [(h, "fuse(all)", "t", 1.0 if i != 1 else None) for i, h in enumerate(s.hashes)])
    _ingest(database, [(s.hashes[0], "other", "t", 1.0)])
    with database.scope() as session:
        outcomes = recipe_outcomes(session, "fuse(all)")
        assert recipe_outcomes(session, "fuse(all)", device_id=s.device_id + 100) == []
    assert [(o.subgraph_id, o.kind, o.ok, o.error_kind) for o in outcomes] == [
        (s.ids[0], s.kinds[0], True, None),
        (s.ids[1], s.kinds[1], False, "wrong_result"),
        (s.ids[2], s.kinds[2], True, None),
    ]
