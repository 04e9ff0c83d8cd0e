"""Optimize jobs from the API: one per (owner, model bytes, device class, toolchain). The same model sent again
for the same device and toolchain gets the job already queued, running or done, instead of tuning it again (also when
both arrive at once: the check and the insert run under a lock of this process and, on PostgreSQL, an advisory lock
on the request, which serializes the API's replicas).

Jobs run where the config says: ``embedded`` (the app's executor thread claims them from the table), ``celery``
(published to the queue named by the device class), ``none`` (left in the table for ``tunebank worker``)."""

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from db.models import Job
from db.repositories import jobs
from db.repositories.jobs import JobStatus
from service.http.auth import Principal
from service.http.errors import Unprocessable
from service.http.state import AppState
from service.http.uploads import Upload
from service.jobs import JOB_KINDS, QUEUE_PARAM

LIVE = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.SUCCEEDED)


@dataclass(frozen=True)
class Submitted:
    job_id: int
    created: bool  # False: the same request was submitted before, and this is that job


def owned_by(principal: Principal):  # noqa: ANN201 (a SQLAlchemy clause)
    """Rows of jobs the principal owns (the local user owns the jobs submitted without a key)."""
    return Job.owner_key_id.is_(None) if principal.key_id is None else Job.owner_key_id == principal.key_id


def submit_optimize(state: AppState, principal: Principal, upload: Upload, *, device_class: str | None,
                    options: dict[str, Any], filename: str) -> Submitted:
    config = state.config
    if config.executor == "celery":
        queue = device_class or config.default_queue
        if not queue:
            raise Unprocessable("name a device_class: jobs go to the Celery queue of that name (e.g. cuda-h200)")
        backend, where = "auto", f"queue:{queue}"
    else:
        target = state.target()
        if device_class and device_class != target.device_class:
            raise Unprocessable(f"this server tunes on device class {target.device_class!r}, not {device_class!r}; "
                                "leave device_class out, or send it to a server (or worker queue) of that class")
        queue, backend, where = None, target.backend, f"{target.device_class}|{target.toolchain}"
    request_key = hashlib.sha256(f"optimize|{upload.digest}|{where}".encode()).hexdigest()
    JOB_KINDS.get("optimize")
    with state.submitting, state.database.scope() as session:
        if session.get_bind().dialect.name == "postgresql":  # API replicas: one submission of a request at a time
            session.execute(select(func.pg_advisory_xact_lock(func.hashtext(request_key))))
        existing = session.scalar(select(Job.id).where(
            Job.kind == "optimize", Job.request_key == request_key, owned_by(principal), Job.status.in_(LIVE))
            .order_by(Job.id.desc()).limit(1))
        if existing is not None:
            return Submitted(existing, False)
        params: dict[str, Any] = {
            **config.job_options, **options, "model": str(upload.path), "backend": backend,
            "index_factory": config.index.factory, "index_metric": config.index.metric.value,
            "filename": filename[:200], "format": upload.format, "sha256": upload.digest,
        }
        if queue is not None:
            params[QUEUE_PARAM] = queue
        job = jobs.enqueue(session, "optimize", params)
        job.owner_key_id, job.request_key = principal.key_id, request_key
        session.flush()
        job_id = job.id
    if queue is not None:
        from service.jobs_celery import publish

        publish(state.celery, job_id, queue)
    return Submitted(job_id, True)
