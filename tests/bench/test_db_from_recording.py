"""bench/db_from_recording.py: a recorded cpu run becomes a crawl database without running a kernel."""

import json
from pathlib import Path

from sqlalchemy import func, select

from bench.db_from_recording import build
from db.models import Measurement
from db.session import Database
from service.embeddings import profiled_subgraphs

DATA = Path(__file__).parents[1] / "service" / "data"


def test_a_recording_fills_a_database_with_its_measurements(tmp_path: Path) -> None:
    recording = json.loads((DATA / "transfer_cpu_replay.json").read_text())
    report, device = build(recording, tmp_path / "db.sqlite")
    assert report.subgraphs == 32 and report.cross_applications > 0
    assert device == recording["measurements"]["device"]["name"]
    results = recording["measurements"]["results"]
    for key, (recipe, seconds) in report.best.items():  # every best is a recorded measurement of that subgraph
        assert results[key][recipe] == seconds
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        with database.scope() as session:
            assert session.scalar(select(func.count()).select_from(Measurement)) == report.measurements
            assert len(profiled_subgraphs(session, 1)) == 32
    finally:
        database.dispose()
