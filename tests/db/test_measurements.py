import math

import pytest
from sqlalchemy import func, select

from db.errors import InvalidRecordError
from db.models import Measurement, Recipe
from db.repositories.measurements import MeasurementIn, ingest_measurements
from db.session import Database


def _m(subgraph: str, recipe: str, median: float | None = 1e-3, **kw) -> MeasurementIn:
    return MeasurementIn(subgraph, recipe, kw.pop("device", "h100"), kw.pop("toolchain", "cuda13"), median, **kw)


def _count(database: Database) -> int:
    with database.scope() as session:
        return session.scalar(select(func.count()).select_from(Measurement)) or 0


def test_the_same_measurement_sent_twice_is_stored_once(database: Database, seed) -> None:
    s = seed(database, 3)
    batch = [_m(h, f"tile(p0,{t})", 1e-3 * t, repeats=5) for h in s.hashes for t in (1, 2)]
    with database.scope() as session:
        first = ingest_measurements(session, batch)
    with database.scope() as session:
        second = ingest_measurements(session, batch + batch[:2])
    assert (first.received, first.inserted, first.duplicates) == (6, 6, 0)
    assert (second.received, second.inserted, second.duplicates) == (8, 0, 8)
    assert _count(database) == 6
    with database.scope() as session:
        assert session.scalar(select(func.count()).select_from(Recipe)) == 2


def test_first_write_wins_and_every_key_part_counts(database: Database, seed) -> None:
    s = seed(database, 1)
    seed(database, 0, device="a100")
    h = s.hashes[0]
    with database.scope() as session:
        ingest_measurements(session, [_m(h, "r", 1.0)])
        result = ingest_measurements(
            session,
            [_m(h, "r", 2.0), _m(h, "r", 1.0, toolchain="cuda12"), _m(h, "r", 1.0, device="a100"), _m(h, "r2", 1.0)],
        )
    assert result.inserted == 3
    with database.scope() as session:
        medians = session.scalars(select(Measurement.median_s).where(Measurement.toolchain == "cuda13")).all()
    assert sorted(medians) == [1.0, 1.0, 1.0]


def test_dicts_and_failures_are_accepted(database: Database, seed) -> None:
    s = seed(database, 1)
    record = {
        "subgraph": s.hashes[0],
        "recipe": "r",
        "device": "h100",
        "toolchain": "t",
        "median_s": None,
        "ok": False,
        "error_kind": "compile_error",
        "repeats": 0,
    }
    with database.scope() as session:
        assert ingest_measurements(session, [record]).inserted == 1
    with database.scope() as session:
        row = session.scalars(select(Measurement)).one()
    assert (row.ok, row.error_kind, row.median_s, row.subgraph_id) == (False, "compile_error", None, s.ids[0])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"median_s": None}, "needs a median"),
        ({"error_kind": "timeout"}, "needs a median and no error"),
        ({"ok": False}, "needs an error_kind"),
        ({"median_s": -1.0}, "finite and >= 0"),
        ({"median_s": math.nan}, "finite and >= 0"),
        ({"median_s": math.inf}, "finite and >= 0"),  # a failure is ok=False with an error kind, not an infinity
        ({"spread_s": math.inf}, "spread_s must be finite and >= 0"),
        ({"repeats": -2}, "repeats must be >= 0"),
    ],
)
def test_malformed_measurements_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(InvalidRecordError, match=message):
        MeasurementIn(**{"subgraph": "s", "recipe": "r", "device": "d", "toolchain": "t", "median_s": 1.0, **fields})


def test_unknown_names_and_fields_are_refused_and_nothing_is_written(database: Database, seed) -> None:
    s = seed(database, 1)
    with pytest.raises(InvalidRecordError, match="unknown subgraph"), database.scope() as session:
        ingest_measurements(session, [_m(s.hashes[0], "r"), _m("f" * 64, "r")])
    with pytest.raises(InvalidRecordError, match="unknown device 'v100'"), database.scope() as session:
        ingest_measurements(session, [_m(s.hashes[0], "r", device="v100")])
    with pytest.raises(InvalidRecordError, match="unknown measurement field"), database.scope() as session:
        ingest_measurements(session, [{"subgraph": s.hashes[0], "colour": "red"}])
    with pytest.raises(InvalidRecordError, match="recipe string"), database.scope() as session:
        ingest_measurements(session, [_m(s.hashes[0], "")])
    assert _count(database) == 0
    with database.scope() as session:
        assert session.scalar(select(func.count()).select_from(Recipe)) == 0


def test_large_batches_cross_page_boundaries(database: Database, seed) -> None:
    s = seed(database, 7)
    batch = [_m(s.hashes[i % 7], f"unroll(r0,{i})", 1e-6 * i) for i in range(2500)]
    with database.scope() as session:
        assert ingest_measurements(session, batch).inserted == 2500
    assert _count(database) == 2500
