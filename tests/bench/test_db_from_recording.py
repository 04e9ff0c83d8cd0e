"""bench/db_from_recording.py: a recorded cpu run becomes a crawl database without running a kernel."""

import json
from pathlib import Path

import pytest
from sqlalchemy import func, select

from bench.db_from_recording import build
from db.models import Measurement
from db.session import Database
from embed.partition import partition
from service.bench_transfer import load_graph
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


def test_a_subset_of_the_recordings_models_holds_only_their_subgraphs(tmp_path: Path) -> None:
    recording = json.loads((DATA / "transfer_cpu_replay.json").read_text())
    whole, _ = build(recording, tmp_path / "whole.sqlite")
    models = recording["config"]["models"]
    kept = [s for spec in models[:2] for s in partition(load_graph(spec))]
    report, _ = build(recording, tmp_path / "part.sqlite", models[:2])
    assert report.subgraphs == len({s.structural_hash for s in kept}) < whole.subgraphs
    kept_keys = {s.structural_hash for s in kept}
    assert report.best and set(report.best) <= kept_keys


def test_a_model_the_recording_lacks_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    recording = json.loads((DATA / "transfer_cpu_replay.json").read_text())
    with pytest.raises(ValueError, match="not models of the recording: vit_block-h128-i64-b1"):
        build(recording, tmp_path / "db.sqlite", ["vit_block-h128-i64-b1"])
    assert not (tmp_path / "db.sqlite").exists()
