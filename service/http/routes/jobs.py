"""``GET /v1/jobs``, ``GET /v1/jobs/{id}``, ``GET /v1/jobs/{id}/plan``: a key sees only the jobs it submitted."""

from pathlib import Path as FilePath
from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import FileResponse
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db.models import Job
from db.repositories.jobs import JobStatus
from service.http.auth import Principal, ReadKey
from service.http.errors import Conflict, NotFound
from service.http.state import SessionDep, StateDep
from service.http.submit import owned_by
from service.http.views import job_view

router = APIRouter(prefix="/v1", tags=["jobs"])
PLAN_MEDIA_TYPE = "application/vnd.tunebank.plan+zip"
JobId = Annotated[int, Path(ge=1, le=2**63 - 1, description="the job's id")]  # what a BIGINT holds


def _own_job(session: Session, principal: Principal, job_id: int) -> Job:
    job = session.scalar(select(Job).where(Job.id == job_id, owned_by(principal), ~Job.kind.startswith("lock:")))
    if job is None:
        raise NotFound(f"no job {job_id} of this API key")
    return job


@router.get("/jobs", operation_id="list_jobs")
def list_jobs(principal: ReadKey, session: SessionDep,
              limit: Annotated[int, Query(ge=1, le=100)] = 20, offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
              status: Annotated[JobStatus | None, Query()] = None) -> dict:
    """This key's jobs, newest first, ``limit`` at a time from ``offset``."""
    query = select(Job).where(owned_by(principal), ~Job.kind.startswith("lock:"))
    if status is not None:
        query = query.where(Job.status == status)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(Job.id.desc()).limit(limit).offset(offset)).all()
    return {"jobs": [job_view(j) for j in rows], "total": total, "limit": limit, "offset": offset,
            "next_offset": offset + limit if offset + limit < total else None}


@router.get("/jobs/{job_id}", operation_id="get_job")
def get_job(job_id: JobId, principal: ReadKey, session: SessionDep) -> dict:
    """A job's status and progress; when an optimize job succeeded, its report (plan and eager times)."""
    return job_view(_own_job(session, principal, job_id))


@router.get("/jobs/{job_id}/plan", operation_id="get_plan", response_class=FileResponse,
            responses={200: {"content": {PLAN_MEDIA_TYPE: {}}, "description": "the plan file (.tbplan)"}})
def get_plan(job_id: JobId, principal: ReadKey, session: SessionDep, state: StateDep) -> FileResponse:
    """The plan file of a succeeded optimize job: what ``tunebank.load`` reads."""
    job = _own_job(session, principal, job_id)
    if job.status != JobStatus.SUCCEEDED:
        detail = f": {job.error}" if job.error else f" ({job.progress:.0%} done)" if job.status == "running" else ""
        raise Conflict(f"job {job_id} is {job.status}{detail}; a plan exists once it succeeded")
    plan = (job.result or {}).get("plan")
    plans = state.config.plans_dir.resolve()
    path = FilePath(str(plan)).resolve() if plan else None
    if path is None or not path.is_relative_to(plans) or not path.is_file():
        raise NotFound(f"job {job_id} has no plan file (it is not an optimize job, or its plan was removed)")
    return FileResponse(path, media_type=PLAN_MEDIA_TYPE, filename=f"job-{job_id}.tbplan")
