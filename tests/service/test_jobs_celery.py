"""Jobs on two real Celery worker processes over the local Redis: the jobs are split between them, one worker is
killed (SIGKILL) in the middle of a job, the other resumes that job from its checkpoint, and no step is recorded
twice. Workers are this file run as a script (with the test job kinds of test_jobs)."""

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from db.migrate import upgrade
from db.repositories import jobs
from db.session import Database

ROOT = Path(__file__).resolve().parents[2]
BROKER = os.environ.get("TUNEBANK_TEST_REDIS", "redis://127.0.0.1:6379/0")


def _require_redis() -> None:
    import redis

    try:
        redis.Redis.from_url(BROKER, socket_connect_timeout=3).ping()
    except redis.RedisError as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis at {BROKER} is unreachable: {e}")
        pytest.skip(f"Redis at {BROKER} is unreachable: {e}")


def _worker(url: str, tmp_path: Path, queue: str, name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, url, str(tmp_path), queue, name], cwd=ROOT, text=True,
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.err", "w"),  # noqa: SIM115
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def _wait_for(condition, what: str, timeout_s: float = 120.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


def test_two_workers_split_the_jobs_and_survive_one_killed_mid_job(tmp_path: Path) -> None:
    _require_redis()
    from service.jobs_celery import celery_app, submit_to
    from tests.service.test_jobs import registry
    url, queue = f"sqlite:///{tmp_path / 'tunebank.db'}", f"test-{secrets.token_hex(4)}"
    database = Database(url)
    upgrade(database.engine)
    workers = [_worker(url, tmp_path, queue, name) for name in ("w1", "w2")]
    try:
        _wait_for(lambda: all((tmp_path / f"{n}.ready").exists() for n in ("w1", "w2")), "both workers to start")
        app = celery_app(BROKER)
        log = tmp_path / "steps.log"
        ids = [submit_to(app, database, "steps", {"steps": 3, "log": str(log), "name": name, "delay_s": 0.3,
                                                  "die_at": 1 if name == "dies" else None}, queue=queue,
                          registry=registry())
               for name in ("a", "b", "c", "dies")]

        def finished() -> bool:
            with database.scope() as session:
                return all(jobs.get_job(session, i).status in ("succeeded", "failed") for i in ids)

        _wait_for(finished, "the jobs to finish")
        assert sorted(w.poll() for w in workers if w.poll() is not None) == [-signal.SIGKILL]  # one died
        lines = log.read_text().splitlines()
        assert sorted(lines) == sorted({f"{n} {s}" for n in ("a", "dies", "b", "c") for s in range(3)})
        with database.scope() as session:
            done = [jobs.get_job(session, i) for i in ids]
        assert [(j.status, j.attempts) for j in done] == [("succeeded", 1)] * 3 + [("succeeded", 2)]
        assert all("_queue" not in j.result for j in done)
        assert len({j.result["pid"] for j in done}) == 2  # both workers ran jobs
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
                try:
                    w.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    w.kill()
        database.dispose()


def main(db_url: str, data_dir: str, queue: str, name: str) -> None:
    from celery.signals import worker_ready

    from service.jobs import Executor, JobContext
    from service.jobs_celery import celery_app, run_worker
    from tests.service.test_jobs import registry

    worker_ready.connect(lambda **_: (Path(data_dir) / f"{name}.ready").touch(), weak=False)
    database = Database(db_url)
    executor = Executor(JobContext(database, Path(data_dir), Path(data_dir) / "index"), registry=registry(),
                        lease_s=600)  # longer than the test waits: the killed worker's job is resumed for its dead pid
    run_worker(celery_app(BROKER), executor, queue=queue, sweep_s=0.5, loglevel="WARNING")
    print(json.dumps({"stopped": name}))


if __name__ == "__main__":
    main(*sys.argv[1:5])
