"""The job executor over the jobs table: results and failures, locks (SQLite and PostgreSQL), and workers in two
processes: a worker killed mid-job leaves the job to the other, which resumes it from its checkpoint, and no job
runs twice. Child workers are this file run as a script."""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from db.migrate import upgrade
from db.repositories import jobs
from db.session import Database
from embed.registry import Registry
from service.jobs import Executor, JobContext, JobProgress, owner_is_dead
from tests.db.conftest import _require_postgres, pg_schema_factory, pg_url  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]


def steps(params: dict[str, Any], progress: JobProgress) -> dict[str, Any]:
    """A resumable job: ``params["steps"]`` steps (``delay_s`` each), each logged to ``params["log"]`` and
    checkpointed; the process kills itself before step ``params["die_at"]`` on its first attempt."""
    done = progress.checkpoint.get("done", 0)
    for step in range(done, params["steps"]):
        if step == params.get("die_at") and progress.attempt == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(params.get("delay_s", 0))
        with open(params["log"], "a") as log:
            log.write(f"{params['name']} {step}\n")
        progress.save({"done": step + 1})
        progress((step + 1) / params["steps"], f"step {step + 1}")
    return {"steps": params["steps"], "pid": os.getpid()}


def boom(params: dict[str, Any], progress: JobProgress) -> dict[str, Any]:
    raise ValueError("no good")


def parent(params: dict[str, Any], progress: JobProgress) -> dict[str, Any]:
    """Spawns a ``steps`` job per entry of ``params["children"]`` (once: the checkpoint names them), joins them."""
    if "children" not in progress.checkpoint:
        with progress.database.scope() as session:
            ids = [progress.spawn(session, "steps", child) for child in params["children"]]
            progress.save({"children": ids}, session)
    done = progress.join(progress.checkpoint["children"], poll_s=0.05)
    return {"children": [[j.id, j.status] for j in done]}


def registry() -> Registry:
    kinds = Registry("job kind")
    kinds.register("steps", steps)
    kinds.register("boom", boom)
    kinds.register("parent", parent)
    return kinds


def executor(database: Database, tmp_path: Path) -> Executor:
    return Executor(JobContext(database, tmp_path, tmp_path / "index"), registry=registry(), lease_s=30)


def worker(db_url: str, tmp_path: Path) -> subprocess.Popen:
    """A child process that runs jobs until none is left."""
    return subprocess.Popen([sys.executable, __file__, db_url, str(tmp_path)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database(request, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        database = Database(f"sqlite:///{tmp_path / 'tunebank.db'}")
    else:
        _require_postgres()
        database = Database(pg_url(request.getfixturevalue("pg_schema_factory")("jobs")))
    upgrade(database.engine)
    yield database
    database.dispose()


def test_a_job_ends_with_its_result_or_its_error(database: Database, tmp_path: Path) -> None:
    run = executor(database, tmp_path)
    with database.scope() as session:
        good = jobs.enqueue(session, "steps", {"steps": 2, "log": str(tmp_path / "log"), "name": "a"}).id
        bad = jobs.enqueue(session, "boom", {}).id
    seen: list[str] = []
    finished = run.run_until_idle(lambda fraction, message: seen.append(message))
    assert [j.id for j in finished] == [bad, good]  # kinds in name order, oldest first within one
    with database.scope() as session:
        ok, failed = jobs.get_job(session, good), jobs.get_job(session, bad)
    assert (ok.status, ok.progress, ok.result["steps"], ok.lease_owner) == ("succeeded", 1.0, 2, None)
    assert (failed.status, failed.error) == ("failed", "ValueError: no good")
    assert seen == ["step 1", "step 2"]


def test_the_lock_has_one_holder_until_released_or_expired(database: Database) -> None:
    with database.scope() as session:
        assert jobs.acquire_lock(session, "crawl", owner="a", lease_s=60)
    with database.scope() as session:
        assert not jobs.acquire_lock(session, "crawl", owner="b", lease_s=60)
        assert jobs.acquire_lock(session, "other", owner="b", lease_s=60)
        assert jobs.lock_holder(session, "crawl")[0] == "a"
        assert jobs.acquire_lock(session, "crawl", owner="a", lease_s=60)  # renewal
        assert jobs.claim_next(session, owner="c", lease_s=60) is None  # lock rows are never jobs
    with database.scope() as session:
        assert jobs.release_lock(session, "crawl", owner="a")
        assert jobs.acquire_lock(session, "crawl", owner="b", lease_s=-1)  # taken, already expired
    with database.scope() as session:
        assert jobs.lock_holder(session, "crawl") is None
        assert jobs.acquire_lock(session, "crawl", owner="c", lease_s=60)
        assert not jobs.acquire_lock(session, "crawl", owner="d", lease_s=60, take_from=["b"])
        assert jobs.acquire_lock(session, "crawl", owner="d", lease_s=60, take_from=["c"])


def test_a_dead_owner_is_recognised_only_on_this_host() -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = os.uname().nodename
    assert owner_is_dead(f"{host}:{dead.stdout.strip()}:abc")
    assert not owner_is_dead(f"{host}:{os.getpid()}:abc")
    assert not owner_is_dead(f"elsewhere-{host}:{dead.stdout.strip()}:abc")
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exits; not reaped until wait()
    while Path(f"/proc/{zombie.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
        time.sleep(0.05)
    assert owner_is_dead(f"{host}:{zombie.pid}:abc")
    zombie.wait()


def test_a_killed_worker_s_job_is_resumed_by_another_process_and_no_job_runs_twice(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tunebank.db'}"
    database = Database(url)
    upgrade(database.engine)
    log = tmp_path / "steps.log"
    ids = [submit_steps(database, log, name, die_at=2 if name == "dies" else None)
           for name in ("dies", "a", "b", "c", "d")]
    first = worker(url, tmp_path)
    first.communicate(timeout=300)
    assert first.returncode == -signal.SIGKILL
    with database.scope() as session:
        job = jobs.get_job(session, ids[0])
        assert (job.status, jobs.checkpoint_of(job)) == ("running", {"done": 2})  # killed before its third step
    pair = [worker(url, tmp_path) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in pair]
    assert [p.returncode for p in pair] == [0, 0], outputs
    lines = log.read_text().splitlines()
    assert sorted(lines) == sorted({f"{n} {s}" for n in ("dies", "a", "b", "c", "d") for s in range(3)})
    with database.scope() as session:
        finished = [jobs.get_job(session, i) for i in ids]
    assert [(j.status, j.attempts) for j in finished] == [("succeeded", 2)] + [("succeeded", 1)] * 4
    database.dispose()


def test_a_job_whose_lease_expired_elsewhere_is_requeued_on_restart(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'tunebank.db'}")
    upgrade(database.engine)
    job_id = submit_steps(database, tmp_path / "steps.log", "x")
    with database.scope() as session:  # a worker on another host claimed it, then vanished
        jobs.claim_next(session, owner="elsewhere:1:abc", lease_s=-1)
    assert executor(database, tmp_path).recover() == 1
    executor(database, tmp_path).run_until_idle()
    with database.scope() as session:
        assert (jobs.get_job(session, job_id).status, jobs.get_job(session, job_id).attempts) == ("succeeded", 2)
    database.dispose()


def submit_steps(database: Database, log: Path, name: str, die_at: int | None = None) -> int:
    with database.scope() as session:
        return jobs.enqueue(session, "steps", {"steps": 3, "log": str(log), "name": name, "die_at": die_at}).id


def main(db_url: str, data_dir: str) -> None:
    database = Database(db_url)
    done = executor(database, Path(data_dir)).run_until_idle()
    print(json.dumps([j.id for j in done]))


if __name__ == "__main__":
    main(*sys.argv[1:3])


def test_a_job_published_to_a_queue_is_left_to_that_queue_s_workers(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'tunebank.db'}")
    upgrade(database.engine)
    with database.scope() as session:
        job_id = jobs.enqueue(session, "steps", {"steps": 1, "log": str(tmp_path / "log"), "name": "q",
                                                 "_queue": "cuda-h200"}).id
    assert executor(database, tmp_path).run_until_idle() == []
    done = executor(database, tmp_path).run_id(job_id)  # what its worker's task does
    assert done is not None and (done.status, "_queue" in done.result) == ("succeeded", False)
    database.dispose()


def test_the_embedded_executor_runs_submitted_jobs_in_the_background(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'tunebank.db'}")
    upgrade(database.engine)
    run = executor(database, tmp_path)
    run.start(poll_s=0.05)
    try:
        job_id = submit_steps(database, tmp_path / "steps.log", "bg")
        deadline = time.monotonic() + 60
        while True:
            with database.scope() as session:
                job = jobs.get_job(session, job_id)
            if job.status == "succeeded" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        run.stop()
    assert (job.status, job.result["pid"]) == ("succeeded", os.getpid())
    database.dispose()


def test_a_parent_runs_the_children_it_can_and_waits_for_those_another_worker_holds(tmp_path: Path) -> None:
    import threading

    database = Database(f"sqlite:///{tmp_path / 'tunebank.db'}")
    upgrade(database.engine)
    log = tmp_path / "steps.log"
    children = [{"steps": 2, "log": str(log), "name": name, "delay_s": 0.2} for name in ("a", "b")]
    with database.scope() as session:
        parent_id = jobs.enqueue(session, "parent", {"children": children, "_queue": "q"}).id
    here, other = executor(database, tmp_path), executor(database, tmp_path)
    published: list[tuple[int, str]] = []
    here.publish = lambda job_id, queue: published.append((job_id, queue))

    def another_worker() -> None:  # takes child b while the parent runs child a, finishes it later
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with database.scope() as session:
                b = [j for j in jobs.list_jobs(session, kind="steps") if j.params["name"] == "b"]
            claimed = other.claim(b[0].id, "steps") if b else None
            if claimed is not None:
                time.sleep(0.5)
                other.run(claimed)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=another_worker)
    thread.start()
    done = here.run_id(parent_id)
    thread.join()
    with database.scope() as session:
        a, b = sorted(jobs.list_jobs(session, kind="steps"), key=lambda j: j.id)
    database.dispose()
    assert done is not None and done.result == {"children": [[a.id, "succeeded"], [b.id, "succeeded"]]}
    assert (a.params["_queue"], b.params["_queue"]) == ("q", "q") and published == [(a.id, "q"), (b.id, "q")]
    assert done.finished_at >= b.finished_at and sorted(log.read_text().splitlines()) == ["a 0", "a 1", "b 0", "b 1"]
