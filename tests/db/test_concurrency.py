"""Writer processes at once: nothing lost, nothing duplicated; a writer killed mid-transaction leaves nothing;
workers claiming jobs at once never hold one job twice."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy import func, select

from db.models import Measurement, Recipe
from db.repositories.jobs import enqueue, list_jobs
from db.repositories.measurements import MeasurementIn, ingest_measurements
from db.session import Database

WORKER = Path(__file__).with_name("ingest_worker.py")
ROOT = Path(__file__).parents[2]
N_SUBGRAPHS = 20


def _spawn(url: str, start: int, count: int, mode: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, str(WORKER), url, str(start), str(count), str(N_SUBGRAPHS), mode]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _count(database: Database, model: type) -> int:
    with database.scope() as session:
        return session.scalar(select(func.count()).select_from(model)) or 0


def test_concurrent_writers_lose_and_duplicate_nothing(database: Database, seed) -> None:
    seed(database, N_SUBGRAPHS)
    # four writers over [0, 1500), [500, 2000), [1000, 2500), [0, 1500): overlapping and identical ranges
    ranges = [(0, 1500), (500, 1500), (1000, 1500), (0, 1500)]
    workers = [_spawn(database.url, start, count, "commit") for start, count in ranges]
    outputs = [w.communicate(timeout=120) for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0, 0], [err[-2000:] for _, err in outputs]
    inserted = [int(out.strip()) for out, _ in outputs]
    assert sum(inserted) == 2500  # every distinct measurement inserted by exactly one writer
    assert _count(database, Measurement) == 2500
    assert _count(database, Recipe) == 2500 // N_SUBGRAPHS
    with database.scope() as session:
        keys = session.execute(
            select(Measurement.subgraph_id, Measurement.recipe_id).group_by(
                Measurement.subgraph_id, Measurement.recipe_id
            )
        ).all()
    assert len(keys) == 2500


def test_killed_writer_leaves_nothing_visible(database: Database, seed) -> None:
    seed(database, N_SUBGRAPHS)
    worker = _spawn(database.url, 0, 2000, "hang")
    try:
        line = worker.stdout.readline() if worker.stdout else ""
        assert line.strip() == "flushed", worker.stderr.read() if worker.stderr else ""
        assert _count(database, Measurement) == 0  # flushed but not committed: invisible to others
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    assert worker.returncode == -signal.SIGKILL
    assert _count(database, Measurement) == 0
    assert _count(database, Recipe) == 0
    # the dead writer's locks are gone: the same rows can be written now
    records = [MeasurementIn(f"{i:064x}", "tile(p0,0)", "h100", "t", 1e-6, 0.0, 3) for i in range(N_SUBGRAPHS)]
    with database.scope() as session:
        assert ingest_measurements(session, records).inserted == N_SUBGRAPHS
    assert _count(database, Measurement) == N_SUBGRAPHS


CLAIMER = Path(__file__).with_name("claim_worker.py")


def test_workers_claiming_at_once_never_hold_one_job_twice(database: Database) -> None:
    with database.scope() as session:
        job_ids = [enqueue(session, "crawl", {"n": i}).id for i in range(150)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    workers = [subprocess.Popen([sys.executable, str(CLAIMER), database.url, f"w{i}"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
               for i in range(3)]
    for w in workers:
        assert w.stdout is not None and w.stdout.readline().strip() == "ready", w.stderr.read() if w.stderr else ""
    for w in workers:  # all at once
        assert w.stdin is not None
        w.stdin.write("go\n")
        w.stdin.flush()
    outputs = [w.communicate(timeout=120) for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    claimed = {f"w{i}": json.loads(out) for i, (out, _) in enumerate(outputs)}
    every = [job_id for ids in claimed.values() for job_id in ids]
    assert sorted(every) == job_ids  # each job claimed by exactly one worker
    with database.scope() as session:
        held = {job.id: (job.lease_owner, job.attempts, job.status) for job in list_jobs(session, limit=1000)}
    assert held == {job_id: (owner, 1, "running") for owner, ids in claimed.items() for job_id in ids}
