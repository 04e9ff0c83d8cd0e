"""Jobs: a queue in a table. Workers claim a job with a lease, report progress, and finish or fail it.

A job whose lease expired (its worker died) can be claimed again; ``attempts`` counts the claims.
"""

import datetime as dt
from collections.abc import Collection
from enum import StrEnum
from typing import Any

from sqlalchemy import or_, select, update
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
