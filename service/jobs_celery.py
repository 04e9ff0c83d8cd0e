"""Scale-out: the same jobs on Celery workers over Redis, one worker per GPU (concurrency 1, so timings never share
a GPU), queues named by device class (``cuda-h200``).

The jobs table stays the truth. A message only says "run job N": the task claims the job in the table (a finished
job, or one a live worker holds, is left alone), runs it with the executor's lease, heartbeat and checkpoints, and
stores the result in the table (Celery's result backend is not used). Messages are acknowledged late; and every
worker sweeps the table: jobs of its queue that a dead worker left running (lease expired, or a dead pid of this
host) are queued again and published, so a killed worker's job is resumed by another, whatever the broker's
visibility timeout. A job whose kind's lock is held elsewhere (a crawl while another crawls) is retried later.
Children a job spawns (a crawl's shards) go to its queue, so every worker of the queue runs them, the parent's worker
included while it waits for them (``JobProgress.join``).

    app = celery_app("redis://127.0.0.1:6379/0")
    job_id = submit_to(app, database, "crawl", params, queue="cuda-h200")
    run_worker(app, Executor(context), queue="cuda-h200")       # what ``tunebank worker --queue cuda-h200`` runs
"""

import datetime as dt
import logging
import os
import socket
import threading
from typing import Any

from celery import Celery
from sqlalchemy import select, update

from db.models import Job
from db.repositories import jobs
from db.repositories.jobs import JobStatus
from db.session import Database
from embed.registry import Registry
from service.jobs import JOB_KINDS, QUEUE_PARAM, Executor, JobFunction, LockBusyError, dead_owners

log = logging.getLogger(__name__)

TASK = "tunebank.run_job"
_executor: Executor | None = None  # the worker's, set by run_worker


def _run_job(task: Any, job_id: int) -> None:
    assert _executor is not None, "run_job runs in a worker started with run_worker"
    try:
        _executor.run_id(job_id)
    except LockBusyError as e:
        log.info("%s; retrying later", e)
        raise task.retry(countdown=_executor.lease_s, max_retries=None) from None


def celery_app(broker_url: str) -> Celery:
    app = Celery("tunebank", broker=broker_url, set_as_current=False)
    app.conf.update(task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
                    task_ignore_result=True, task_serializer="json", accept_content=["json"],
                    broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
    app.task(name=TASK, bind=True)(_run_job)
    return app


def publish(app: Celery, job_id: int, queue: str) -> None:
    app.send_task(TASK, args=[job_id], queue=queue)


def submit_to(app: Celery, database: Database, kind: str, params: dict[str, Any], *, queue: str,
              registry: Registry[JobFunction] = JOB_KINDS) -> int:
    """Queue a job of a registered kind in the table and publish it to ``queue``; returns its id."""
    registry.get(kind)
    with database.scope() as session:
        job_id = jobs.enqueue(session, kind, {**params, QUEUE_PARAM: queue}).id
    publish(app, job_id, queue)
    return job_id


def _expired(expires: dt.datetime | None, now: dt.datetime) -> bool:
    if expires is None:
        return True
    return (expires if expires.tzinfo else expires.replace(tzinfo=dt.UTC)) < now


def sweep(app: Celery, database: Database, queue: str) -> list[int]:
    """Queue again, and publish, the jobs of ``queue`` that a dead worker left running; their ids."""
    now = dt.datetime.now(dt.UTC)
    with database.scope() as session:
        dead = set(dead_owners(session))
        rows = session.execute(select(Job.id, Job.lease_owner, Job.lease_expires_at, Job.params)
                               .where(Job.status == JobStatus.RUNNING)).all()
        orphans = [r for r in rows if (r.params or {}).get(QUEUE_PARAM) == queue
                   and (r.lease_owner in dead or _expired(r.lease_expires_at, now))]
        requeued = [r.id for r in orphans if session.execute(
            update(Job).where(Job.id == r.id, Job.status == JobStatus.RUNNING, Job.lease_owner == r.lease_owner)
            .values(status=JobStatus.QUEUED, lease_owner=None, lease_expires_at=None, updated_at=now)).rowcount]
    for job_id in requeued:
        log.warning("job %s: its worker died; queued again on %s", job_id, queue)
        publish(app, job_id, queue)
    return requeued


def run_worker(app: Celery, executor: Executor, *, queue: str, sweep_s: float | None = None,
               loglevel: str = "INFO") -> None:
    """Consume ``queue`` one job at a time in this process (solo pool) until stopped, sweeping the table every
    ``sweep_s`` seconds (default: a third of the lease)."""
    global _executor
    _executor = executor
    if executor.publish is None:
        executor.publish = lambda job_id, to: publish(app, job_id, to)
    stopped = threading.Event()
    interval = sweep_s if sweep_s is not None else executor.lease_s / 3

    def sweeper() -> None:
        while not stopped.wait(interval):
            try:
                sweep(app, executor.database, queue)
            except Exception:
                log.exception("sweeping the jobs table failed; trying again")

    sweep(app, executor.database, queue)
    threading.Thread(target=sweeper, daemon=True, name="tunebank-sweeper").start()
    try:
        app.Worker(queues=[queue], concurrency=1, pool="solo", loglevel=loglevel, without_gossip=True,
                   without_mingle=True, hostname=f"{queue}@{socket.gethostname()}-{os.getpid()}").start()
    finally:
        stopped.set()
