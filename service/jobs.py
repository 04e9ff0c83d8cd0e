"""Jobs: kinds registered by name, run by an executor over the jobs table (the embedded default; Celery workers run
the same functions).

    JOB_KINDS.register_lazy("optimize", "service.optimize:optimize_job")   # function(params, progress) -> dict
    job_id = submit(database, "crawl", params)
    Executor(JobContext(database, data_dir, index_dir), lease_s=60).run_until_idle()

A running job holds a lease that a heartbeat thread renews; when its process dies the lease expires (or, on the
same host, its pid is gone) and the next executor claims it again, ``attempts`` counting the claims. A job function
gets ``progress``: ``progress(fraction, message)`` reports, ``progress.checkpoint`` is the state the previous
attempt saved with ``progress.save(state, session)``, so a resumable job goes on where it stopped. Kinds in
``EXCLUSIVE`` run one at a time across processes: the executor takes the kind's database lock before claiming one.

A job can split its work into child jobs: ``progress.spawn(session, kind, params)`` queues one (on the parent's Celery
queue, if it has one) in the transaction that saves the checkpoint naming it, and ``progress.join(ids)`` publishes
them and waits for them, running the ones this process can claim meanwhile, so the workers of the queue (the parent's
included) run them in parallel. A crawl's shards are such children (``service.crawl_run``).
"""

import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import Job
from db.repositories import jobs
from db.repositories.jobs import JobStatus
from db.session import Database
from embed.registry import Registry

log = logging.getLogger(__name__)

JobFunction = Callable[[dict[str, Any], "JobProgress"], dict[str, Any]]
JOB_KINDS: Registry[JobFunction] = Registry("job kind")
JOB_KINDS.register_lazy("crawl", "service.crawl_run:crawl_job")
JOB_KINDS.register_lazy("crawl_shard", "service.crawl_run:crawl_shard_job")
JOB_KINDS.register_lazy("optimize", "service.optimize:optimize_job")
EXCLUSIVE = {"crawl": "crawl"}  # kind -> the lock its jobs hold while they run (a crawl's shards hold none)
MAX_ATTEMPTS = {"crawl": 20, "crawl_shard": 20}  # they resume where they stopped: every attempt makes progress
DEFAULT_MAX_ATTEMPTS = 3
QUEUE_PARAM = "_queue"  # in a job's params: the Celery queue it was published to (the function never sees it)

Listener = Callable[[float, str], None]
Publisher = Callable[[int, str], None]  # (job id, queue): tell the queue's workers to run the job


class LockBusyError(RuntimeError):
    """The lock a job's kind needs is held by another process."""


class LeaseLostError(RuntimeError):
    """This worker no longer holds the job (its lease expired and another worker claimed it)."""


def new_owner() -> str:
    """A lease owner id: host, pid and a random tag."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def owner_is_dead(owner: str) -> bool:
    """Whether ``owner`` names a process of this host that no longer exists (other hosts: unknown, False)."""
    parts = owner.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # a zombie (killed, not yet reaped by its parent) is dead too
        return Path(f"/proc/{parts[1]}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def dead_owners(session: Session) -> list[str]:
    """Lease owners of running jobs and locks that are dead processes of this host."""
    query = select(Job.lease_owner).where(Job.lease_owner.is_not(None)).distinct()
    return [o for o in session.scalars(query) if owner_is_dead(o)]


def submit(database: Database, kind: str, params: dict[str, Any]) -> int:
    """Queue a job of a registered kind; returns its id."""
    JOB_KINDS.get(kind)  # unknown kinds fail here, listing the known ones
    with database.scope() as session:
        return jobs.enqueue(session, kind, params).id


@dataclass(frozen=True)
class JobContext:
    """What the entry point that runs jobs (CLI, app, worker) passes them from its settings."""

    database: Database
    data_dir: Path  # kernel cache, encoder files
    index_dir: Path  # vector index files


class JobProgress:
    """What a job function gets: report progress, read and save its checkpoint, and its ``context``."""

    def __init__(self, context: JobContext, job: Job, owner: str, listener: Listener | None = None, *,
                 executor: "Executor | None" = None) -> None:
        self.context, self.job_id, self.owner, self.listener = context, job.id, owner, listener
        self.database = context.database
        self.attempt = job.attempts
        self.checkpoint: dict[str, Any] = jobs.checkpoint_of(job)
        self.fraction = job.progress
        self.lost = False
        self.queue: str | None = (job.params or {}).get(QUEUE_PARAM)  # the Celery queue it was published to
        self.executor = executor  # the one running it, which runs the children ``join`` can claim

    def __call__(self, fraction: float, message: str = "") -> None:
        if self.lost:
            raise LeaseLostError(f"job {self.job_id}: lease lost to another worker")
        self.fraction = fraction
        if self.listener is not None:
            self.listener(fraction, message)

    def save(self, checkpoint: dict[str, Any], session: Session | None = None) -> None:
        """Store ``checkpoint`` (in ``session``'s transaction, so it commits with the work it describes)."""
        with contextlib.nullcontext(session) if session is not None else self.database.scope() as s:
            if not jobs.save_checkpoint(s, self.job_id, owner=self.owner, checkpoint=checkpoint):
                self.lost = True
                raise LeaseLostError(f"job {self.job_id}: lease lost to another worker")
        self.checkpoint = checkpoint

    def spawn(self, session: Session, kind: str, params: dict[str, Any]) -> int:
        """Queue a child job of ``kind`` in ``session``'s transaction (commit it with the checkpoint that names it,
        so a restarted parent finds its children), on this job's queue when it has one; returns its id."""
        (self.executor.registry if self.executor is not None else JOB_KINDS).get(kind)
        return jobs.enqueue(session, kind, {**params, **({QUEUE_PARAM: self.queue} if self.queue else {})}).id

    def join(self, job_ids: Sequence[int], *, report: Callable[[int, int], None] | None = None,
             poll_s: float = 0.5) -> list[Job]:
        """Wait until the jobs ``job_ids`` (children from ``spawn``) have finished; the finished jobs, in order.

        They are published to this job's queue first (again on a resumed attempt: a worker drops a message for a job
        that finished or that a live worker holds). Meanwhile this process runs those it can claim, so the worker
        waiting on them works with the others, and takes over a child whose holder died. ``report(done, total)`` is
        called as they finish; a lost lease on this job raises ``LeaseLostError``."""
        executor = self.executor
        assert executor is not None, "join needs the executor that runs this job"
        published, done = False, -1
        while True:
            with self.database.scope() as session:
                children = [jobs.get_job(session, i) for i in job_ids]
            waiting = [j for j in children if j.status in (JobStatus.QUEUED, JobStatus.RUNNING)]
            if report is not None and len(children) - len(waiting) != done:
                done = len(children) - len(waiting)
                report(done, len(children))
            if not waiting:
                return children
            if self.lost:
                raise LeaseLostError(f"job {self.job_id}: lease lost to another worker")
            if not published and self.queue and executor.publish is not None:
                for child in waiting:
                    executor.publish(child.id, self.queue)
                published = True
            ran = False
            for child in waiting:
                claimed = executor.claim(child.id, child.kind)
                if claimed is not None:
                    executor.run(claimed)
                    ran = True
            if not ran:
                time.sleep(poll_s)


class _Heartbeat:
    """Renews a job's lease (and its lock) every ``lease_s / 3`` seconds in a thread."""

    def __init__(self, database: Database, progress: JobProgress, lease_s: float, lock: str | None) -> None:
        self.database, self.progress, self.lease_s, self.lock = database, progress, lease_s, lock
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name=f"heartbeat-{progress.job_id}")

    def _loop(self) -> None:
        while not self.stopped.wait(self.lease_s / 3):
            try:
                with self.database.scope() as session:
                    held = jobs.heartbeat(session, self.progress.job_id, owner=self.progress.owner,
                                          lease_s=self.lease_s, progress=self.progress.fraction)
                    if self.lock is not None:
                        jobs.acquire_lock(session, self.lock, owner=self.progress.owner, lease_s=self.lease_s)
                if not held:
                    self.progress.lost = True
                    return
            except Exception:  # a database hiccup: try again at the next beat
                log.exception("job %s: heartbeat failed", self.progress.job_id)

    def __enter__(self) -> "_Heartbeat":
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopped.set()
        self.thread.join()


class Executor:
    """Claims jobs of ``kinds`` (default: every registered kind) from the table and runs them in this process."""

    def __init__(self, context: JobContext, *, kinds: Collection[str] | None = None, lease_s: float = 60.0,
                 owner: str | None = None, registry: Registry[JobFunction] = JOB_KINDS,
                 publish: Publisher | None = None) -> None:
        self.context, self.database, self.lease_s, self.registry = context, context.database, lease_s, registry
        self.publish = publish  # how children of a job published to a queue reach its workers (set by Celery's)
        self.kinds = sorted(kinds if kinds is not None else registry.names())
        self.owner = owner or new_owner()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held: set[str] = set()

    def recover(self) -> int:
        """Re-queue this executor's kinds of jobs whose worker died (lease expired, or a dead pid of this host)."""
        with self.database.scope() as session:
            dead = dead_owners(session)
            n = jobs.requeue_expired(session, kinds=self.kinds)
            n += jobs.requeue_owned(session, owners=dead, kinds=self.kinds)
        return n

    @contextlib.contextmanager
    def holding(self, lock: str) -> Iterator[bool]:
        """Take lock ``lock`` for this executor while the block runs; yields whether it was taken (re-entrant)."""
        if lock in self._held:
            yield True
            return
        with self.database.scope() as session:
            taken = jobs.acquire_lock(session, lock, owner=self.owner, lease_s=self.lease_s,
                                      take_from=dead_owners(session))
        if taken:
            self._held.add(lock)
        try:
            yield taken
        finally:
            if taken:
                self._held.discard(lock)
                with self.database.scope() as session:
                    jobs.release_lock(session, lock, owner=self.owner)

    def _claim(self, kind: str) -> Job | None:
        """The oldest claimable job of ``kind``, leased to this executor; jobs published to a Celery queue are left
        to that queue's workers."""
        with self.database.scope() as session:
            rows = session.execute(select(Job.id, Job.params).where(
                Job.kind == kind, Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING])).order_by(Job.id)).all()
            dead = dead_owners(session)
            for job_id, params in rows:
                if (params or {}).get(QUEUE_PARAM):
                    continue
                job = jobs.claim_job(session, job_id, owner=self.owner, lease_s=self.lease_s, take_from=dead,
                                     max_attempts=MAX_ATTEMPTS.get(kind, DEFAULT_MAX_ATTEMPTS))
                if job is not None:
                    return job
        return None

    def run_next(self, listener: Listener | None = None) -> Job | None:
        """Claim and run one job (oldest first within a kind); ``None`` when there was none to claim."""
        self.recover()
        for kind in self.kinds:
            lock = EXCLUSIVE.get(kind)
            with contextlib.nullcontext(True) if lock is None else self.holding(lock) as free:
                job = self._claim(kind) if free else None
                if job is not None:
                    return self.run(job, listener, lock=lock)
        return None

    def run_id(self, job_id: int, listener: Listener | None = None) -> Job | None:
        """Claim and run job ``job_id`` (what a Celery task does); ``None`` when it is not claimable now (finished,
        or held by a live worker). Raises ``LockBusyError`` when its kind's lock is held elsewhere."""
        with self.database.scope() as session:
            job = jobs.get_job(session, job_id)
            kind, queue = job.kind, (job.params or {}).get(QUEUE_PARAM)
        lock = EXCLUSIVE.get(kind)
        if lock is not None and queue:  # one crawl at a time per queue (device class), not across the cluster
            lock = f"{lock}:{queue}"
        with contextlib.nullcontext(True) if lock is None else self.holding(lock) as free:
            if not free:
                raise LockBusyError(f"job {job_id}: lock {lock!r} is held by another process")
            job = self.claim(job_id, kind)
            return None if job is None else self.run(job, listener, lock=lock)

    def claim(self, job_id: int, kind: str) -> Job | None:
        """Lease job ``job_id`` (of ``kind``) to this executor, taking it over from a dead holder; ``None`` when it
        is not claimable (finished, held by a live worker, or out of attempts: then it is marked failed)."""
        with self.database.scope() as session:
            return jobs.claim_job(session, job_id, owner=self.owner, lease_s=self.lease_s,
                                  max_attempts=MAX_ATTEMPTS.get(kind, DEFAULT_MAX_ATTEMPTS),
                                  take_from=dead_owners(session))

    def run(self, job: Job, listener: Listener | None = None, *, lock: str | None = None) -> Job:
        """Run a job this executor claimed, and finish it (succeeded, or failed with the error)."""
        progress = JobProgress(self.context, job, self.owner, listener, executor=self)
        log.info("job %s (%s) attempt %s: started", job.id, job.kind, job.attempts)
        try:
            with _Heartbeat(self.database, progress, self.lease_s, lock):
                params = {k: v for k, v in job.params.items() if k != QUEUE_PARAM}
                result = self.registry.get(job.kind)(params, progress)
        except LeaseLostError:
            log.warning("job %s: lease lost; another worker goes on with it", job.id)
        except KeyboardInterrupt:
            with self.database.scope() as session:
                jobs.requeue_owned(session, owners=[self.owner], kinds=[job.kind])
            raise
        except Exception as e:  # a job's failure is its result; the executor goes on
            log.exception("job %s (%s) failed", job.id, job.kind)
            with self.database.scope() as session:
                jobs.finish(session, job.id, owner=self.owner, status=JobStatus.FAILED,
                            error=f"{type(e).__name__}: {e}"[:2000])
        else:
            with self.database.scope() as session:
                jobs.finish(session, job.id, owner=self.owner, status=JobStatus.SUCCEEDED, result=result)
        with self.database.scope() as session:
            return jobs.get_job(session, job.id)

    def run_until_idle(self, listener: Listener | None = None) -> list[Job]:
        """Run jobs until none is left to claim; the jobs run, in order."""
        done = []
        while (job := self.run_next(listener)) is not None:
            done.append(job)
        return done

    def start(self, poll_s: float = 1.0) -> None:
        """Run jobs in a background thread until ``stop()``, polling the table every ``poll_s`` seconds when idle."""
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    if self.run_next() is None:
                        self._stop.wait(poll_s)
                except Exception:
                    log.exception("executor loop")
                    self._stop.wait(poll_s)

        self._thread = threading.Thread(target=loop, daemon=True, name="tunebank-jobs")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
