"""Jobs: a queue in a table. Workers claim a job with a lease, report progress, and finish or fail it.

A job whose lease expired (its worker died) can be claimed again; ``attempts`` counts the claims.
"""

import datetime as dt
from collections.abc import Collection
from enum import StrEnum
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from db.models import Job
from db.repositories._get import get_or_raise


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def enqueue(session: Session, kind: str, params: dict[str, Any]) -> Job:
    job = Job(kind=kind, status=JobStatus.QUEUED, params=params, progress=0.0, attempts=0)
    session.add(job)
    session.flush()
    return job


def get_job(session: Session, job_id: int) -> Job:
    return get_or_raise(session, Job, job_id, "job")


def list_jobs(
    session: Session, *, status: JobStatus | None = None, kind: str | None = None, limit: int = 100
) -> list[Job]:
    query = select(Job).order_by(Job.id.desc()).limit(limit)
    if status is not None:
        query = query.where(Job.status == status)
    if kind is not None:
        query = query.where(Job.kind == kind)
    return list(session.scalars(query))


def _claimable(now: dt.datetime):  # noqa: ANN202 (a SQLAlchemy clause)
    expired = (Job.status == JobStatus.RUNNING) & (Job.lease_expires_at < now)
    return or_(Job.status == JobStatus.QUEUED, expired)


def claim_next(
    session: Session, *, owner: str, lease_s: float, kinds: Collection[str] | None = None, max_attempts: int = 3
) -> Job | None:
    """Lease the oldest queued (or lease-expired) job to ``owner``; ``None`` when there is none.

    The claim is a conditional UPDATE, so two workers never hold the same job. A job that was already
    claimed ``max_attempts`` times is marked failed instead of being handed out again.
    """
    while True:
        now = _now()
        query = select(Job.id, Job.attempts).where(_claimable(now)).order_by(Job.id).limit(1)
        if kinds is not None:
            query = query.where(Job.kind.in_(sorted(kinds)))
        row = session.execute(query).first()
        if row is None:
            return None
        values: dict[str, Any] = {
            "status": JobStatus.RUNNING,
            "attempts": row.attempts + 1,
            "lease_owner": owner,
            "lease_expires_at": now + dt.timedelta(seconds=lease_s),
            "started_at": now,
            "updated_at": now,
        }
        if row.attempts >= max_attempts:
            values = {
                "status": JobStatus.FAILED,
                "error": f"gave up after {row.attempts} attempts",
                "finished_at": now,
                "lease_owner": None,
                "lease_expires_at": None,
                "updated_at": now,
            }
        claimed = session.execute(
            update(Job).where(Job.id == row.id, Job.attempts == row.attempts, _claimable(now)).values(**values)
        )
        if claimed.rowcount == 1 and values["status"] == JobStatus.RUNNING:
            session.flush()
            job = session.get(Job, row.id)
            assert job is not None
            session.refresh(job)
            return job


def heartbeat(session: Session, job_id: int, *, owner: str, lease_s: float, progress: float | None = None) -> bool:
    """Extend the lease (and set progress) if ``owner`` still holds the job; False when it lost it."""
    now = _now()
    values: dict[str, Any] = {"lease_expires_at": now + dt.timedelta(seconds=lease_s), "updated_at": now}
    if progress is not None:
        values["progress"] = min(max(progress, 0.0), 1.0)
    result = session.execute(
        update(Job).where(Job.id == job_id, Job.lease_owner == owner, Job.status == JobStatus.RUNNING).values(**values)
    )
    return result.rowcount == 1


def finish(
    session: Session,
    job_id: int,
    *,
    owner: str | None,
    status: JobStatus,
    result: dict[str, Any] | None = None,
    error: str | None = None,
) -> bool:
    """End a job (succeeded, failed or cancelled) if ``owner`` holds it (``None``: whoever holds it, e.g. a cancel)."""
    now = _now()
    query = update(Job).where(Job.id == job_id, Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]))
    if owner is not None:
        query = query.where(Job.lease_owner == owner)
    values: dict[str, Any] = {
        "status": status,
        "result": result,
        "error": error,
        "finished_at": now,
        "updated_at": now,
        "lease_owner": None,
        "lease_expires_at": None,
    }
    if status == JobStatus.SUCCEEDED:
        values["progress"] = 1.0
    return session.execute(query.values(**values)).rowcount == 1


def save_checkpoint(session: Session, job_id: int, *, owner: str, checkpoint: dict[str, Any]) -> bool:
    """Store a running job's resumable state (in ``result["checkpoint"]``) if ``owner`` still holds it."""
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.lease_owner == owner, Job.status == JobStatus.RUNNING)
        .values(result={"checkpoint": checkpoint}, updated_at=_now())
    )
    return result.rowcount == 1


def checkpoint_of(job: Job) -> dict[str, Any]:
    """The state a job saved with ``save_checkpoint`` before it was interrupted (empty when none)."""
    return dict((job.result or {}).get("checkpoint") or {}) if job.status == JobStatus.RUNNING else {}


def requeue_expired(session: Session, *, kinds: Collection[str] | None = None) -> int:
    """Put running jobs whose lease expired (their worker died) back in the queue; returns how many."""
    now = _now()
    query = update(Job).where(Job.status == JobStatus.RUNNING, Job.lease_expires_at < now)
    if kinds is not None:
        query = query.where(Job.kind.in_(sorted(kinds)))
    values = {"status": JobStatus.QUEUED, "lease_owner": None, "lease_expires_at": None, "updated_at": now}
    return session.execute(query.values(**values)).rowcount


# Locks: one row per name in the jobs table (kind ``lock:NAME``, status ``lock``, never claimed as a job); the
# holder is its lease owner until the lease expires. Taking one is a conditional UPDATE of that row, so two
# processes never hold it at once, on SQLite and on PostgreSQL.
LOCK_STATUS = "lock"


def _lock_id(session: Session, name: str) -> int:
    kind = f"lock:{name}"
    if session.get_bind().dialect.name == "postgresql":  # SQLite serializes writers by itself
        session.execute(select(func.pg_advisory_xact_lock(func.hashtext(kind))))
    query = select(Job.id).where(Job.kind == kind, Job.status == LOCK_STATUS).order_by(Job.id).limit(1)
    lock_id = session.scalar(query)
    if lock_id is None:  # two processes may both add one: everyone uses the lowest id
        with session.begin_nested():
            session.add(Job(kind=kind, status=LOCK_STATUS, params={}, progress=0.0, attempts=0))
        lock_id = session.scalar(query)
    assert lock_id is not None
    return lock_id


def acquire_lock(session: Session, name: str, *, owner: str, lease_s: float,
                 take_from: Collection[str] = ()) -> bool:
    """Take (or renew) lock ``name`` for ``owner`` for ``lease_s`` seconds: True when ``owner`` holds it now.

    It is free when nobody holds it, its lease expired, or its holder is in ``take_from`` (holders known dead)."""
    lock_id = _lock_id(session, name)
    now = _now()
    free = or_(Job.lease_owner.is_(None), Job.lease_expires_at < now, Job.lease_owner.in_([owner, *take_from]))
    taken = session.execute(
        update(Job).where(Job.id == lock_id, free)
        .values(lease_owner=owner, lease_expires_at=now + dt.timedelta(seconds=lease_s), updated_at=now)
    )
    return taken.rowcount == 1


def lock_holder(session: Session, name: str) -> tuple[str, dt.datetime] | None:
    """Who holds lock ``name`` and until when (``None`` when it is free)."""
    row = session.execute(
        select(Job.lease_owner, Job.lease_expires_at)
        .where(Job.kind == f"lock:{name}", Job.status == LOCK_STATUS, Job.lease_owner.is_not(None))
        .order_by(Job.id).limit(1)
    ).first()
    if row is None or row.lease_expires_at is None:
        return None
    expires = row.lease_expires_at if row.lease_expires_at.tzinfo else row.lease_expires_at.replace(tzinfo=dt.UTC)
    return (row.lease_owner, expires) if expires >= _now() else None


def release_lock(session: Session, name: str, *, owner: str) -> bool:
    result = session.execute(
        update(Job).where(Job.kind == f"lock:{name}", Job.status == LOCK_STATUS, Job.lease_owner == owner)
        .values(lease_owner=None, lease_expires_at=None, updated_at=_now())
    )
    return result.rowcount > 0


def requeue_owned(session: Session, *, owners: Collection[str], kinds: Collection[str] | None = None) -> int:
    """Put the running jobs that ``owners`` hold back in the queue (owners known dead, or one that stops)."""
    if not owners:
        return 0
    query = update(Job).where(Job.status == JobStatus.RUNNING, Job.lease_owner.in_(sorted(owners)))
    if kinds is not None:
        query = query.where(Job.kind.in_(sorted(kinds)))
    values = {"status": JobStatus.QUEUED, "lease_owner": None, "lease_expires_at": None, "updated_at": _now()}
    return session.execute(query.values(**values)).rowcount


def claim_job(session: Session, job_id: int, *, owner: str, lease_s: float, max_attempts: int = 3,
              take_from: Collection[str] = ()) -> Job | None:
    """Lease job ``job_id`` to ``owner`` if it is claimable (queued, lease expired, or held by one of ``take_from``,
    holders known dead); ``None`` when it is not (finished, or a live worker holds it). Like ``claim_next``, a job
    claimed ``max_attempts`` times is marked failed instead."""
    now = _now()
    claimable = or_(_claimable(now), (Job.status == JobStatus.RUNNING) & Job.lease_owner.in_(sorted(take_from)))
    row = session.execute(select(Job.id, Job.attempts).where(Job.id == job_id, claimable)).first()
    if row is None:
        return None
    if row.attempts >= max_attempts:
        values: dict[str, Any] = {"status": JobStatus.FAILED, "error": f"gave up after {row.attempts} attempts",
                                  "finished_at": now, "lease_owner": None, "lease_expires_at": None, "updated_at": now}
    else:
        values = {"status": JobStatus.RUNNING, "attempts": row.attempts + 1, "lease_owner": owner,
                  "lease_expires_at": now + dt.timedelta(seconds=lease_s), "started_at": now, "updated_at": now}
    claimed = session.execute(update(Job).where(Job.id == job_id, Job.attempts == row.attempts, claimable)
                              .values(**values))
    if claimed.rowcount != 1 or values["status"] != JobStatus.RUNNING:
        return None
    session.flush()
    job = session.get(Job, job_id)
    assert job is not None
    session.refresh(job)
    return job
