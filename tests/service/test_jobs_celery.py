"""Jobs on two real Celery worker processes over the local Redis: the jobs are split between them, one worker is
killed (SIGKILL) in the middle of a job, the other resumes that job from its checkpoint, and no step is recorded
twice; a crawl in shards the same way, then an optimize job. Workers are this file run as a script (with the test job
kinds of test_jobs, or the synthetic crawl kinds of test_crawl_run and the real optimize)."""

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


def _worker(url: str, tmp_path: Path, queue: str, name: str, *kinds: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, url, str(tmp_path), queue, name, *kinds], cwd=ROOT, text=True,
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.err", "w"),  # noqa: SIM115
                            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})


def _stop(workers: list[subprocess.Popen]) -> None:
    for w in workers:
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()


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
        _stop(workers)
        database.dispose()


CRAWL = {"models": ["bert_encoder-h64-s16-b1", "lm_head-h64-v256-t32", "gpt_decoder-h64-s16-b1"], "budget": 3,
         "retrain_min": 2, "backend": "cpu"}
UNSEEN = "cnn_head-c32-i7-b1"  # a model the crawl does not see


@pytest.mark.slow
def test_two_workers_split_a_crawl_survive_one_killed_mid_shard_and_run_an_optimize_job(tmp_path: Path) -> None:
    _require_redis()
    from service.jobs_celery import celery_app, submit_to
    from tests.service.test_crawl_run import child, measured, snapshot, without_shards
    from transforms.plan import read_plan

    reference, cluster = tmp_path / "reference", tmp_path / "cluster"
    urls = {}
    for folder in (reference, cluster):
        folder.mkdir()
        urls[folder] = f"sqlite:///{folder / 'tunebank.db'}"
        database = Database(urls[folder])
        upgrade(database.engine)
        database.dispose()
    queue = f"test-{secrets.token_hex(4)}"
    # w1 dies (SIGKILL) at the 2nd measuring call of the 2nd shard it runs; every measuring call takes 0.1 s more
    workers = {name: _worker(urls[cluster], cluster, queue, name, "crawl", kill) for name, kill in
               (("w1", "shard:2:2"), ("w2", ""))}
    database = Database(urls[cluster])
    try:  # the same crawl uninterrupted, in one process, while the workers start
        done = child(urls[reference], reference, reference / "measured.log", params=CRAWL, device="local")
        assert done.returncode == 0, done.stderr
        expected = snapshot(urls[reference], reference)
        _wait_for(lambda: all((cluster / f"{n}.ready").exists() for n in workers), "both workers to start")
        app = celery_app(BROKER)
        crawl = submit_to(app, database, "crawl", {**CRAWL, "shards": 4}, queue=queue)
        _wait_for(lambda: _finished(database, crawl), "the crawl to finish")

        assert workers["w1"].wait(timeout=10) == -signal.SIGKILL and workers["w2"].poll() is None
        with database.scope() as session:
            job = jobs.get_job(session, crawl)
            shards = [jobs.get_job(session, i) for i in (job.result or {}).get("shards", [])]
        assert job.status == "succeeded", job.error
        assert without_shards(snapshot(urls[cluster], cluster)) == without_shards(expected)
        logs = {name: measured(cluster / f"{name}.log") for name in workers}
        every = logs["w1"] + logs["w2"]  # kernels measured by either worker: each once, those of the reference
        assert logs["w1"] and logs["w2"] and len(every) == len(set(every))
        assert sorted(every) == sorted(measured(reference / "measured.log"))
        assert len(shards) == 4 and {j.status for j in shards} == {"succeeded"}
        assert sorted(j.attempts for j in shards) == [1, 1, 1, 2]  # the killed shard, retried once
        pids = {w.pid: name for name, w in workers.items()}
        ran = sorted((pids[int(j.result["worker"].split(":")[1])], j.attempts) for j in shards)
        assert ran[0] == ("w1", 1) and ("w2", 2) in ran, ran  # w1 finished a shard, w2 took over the killed one
        assert any(x.result["worker"] != y.result["worker"] and x.started_at < y.finished_at
                   and y.started_at < x.finished_at for x in shards for y in shards)  # two ran at once

        optimize = submit_to(app, database, "optimize", {"model": f"zoo:{UNSEEN}", "backend": "cpu", "k": 2},
                             queue=queue)
        _wait_for(lambda: _finished(database, optimize), "the optimize job to finish")
        with database.scope() as session:
            job = jobs.get_job(session, optimize)
        assert job.status == "succeeded", job.error
        report = job.result["report"]
        assert report["model"] == f"zoo:{UNSEEN}" and report["measured"] > 0
        assert any(s["source"] == "transfer" and s["neighbours"] for s in report["subgraphs"])  # the crawl's
        plan, weights = read_plan(job.result["plan"])
        assert plan.steps and weights is not None
    finally:
        _stop(list(workers.values()))
        database.dispose()


def _finished(database: Database, job_id: int) -> bool:
    with database.scope() as session:
        return jobs.get_job(session, job_id).status in ("succeeded", "failed")


def main(db_url: str, data_dir: str, queue: str, name: str, kinds: str = "steps", kill: str = "") -> None:
    """A worker; ``kinds``: ``steps`` (test_jobs' kinds) or ``crawl`` (test_crawl_run's synthetic crawl kinds, with
    ``kill``, measuring to ``NAME.log``, and the real optimize)."""
    from celery.signals import worker_ready

    from service.jobs import JOB_KINDS, Executor, JobContext
    from service.jobs_celery import celery_app, run_worker
    from tests.service.test_crawl_run import synthetic_kinds
    from tests.service.test_jobs import registry

    worker_ready.connect(lambda **_: (Path(data_dir) / f"{name}.ready").touch(), weak=False)
    if kinds == "crawl":
        kinds_ = synthetic_kinds(Path(data_dir), Path(data_dir) / f"{name}.log", kill, device="local", delay_s=0.1)
        kinds_.register("optimize", JOB_KINDS.get("optimize"))
    else:
        kinds_ = registry()
    database = Database(db_url)
    executor = Executor(JobContext(database, Path(data_dir), Path(data_dir) / "index"), registry=kinds_,
                        lease_s=600)  # longer than the test waits: the killed worker's job is resumed for its dead pid
    run_worker(celery_app(BROKER), executor, queue=queue, sweep_s=0.5, loglevel="WARNING")
    print(json.dumps({"stopped": name}))


if __name__ == "__main__":
    main(*sys.argv[1:7])
