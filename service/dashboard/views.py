"""What the dashboard's pages show, read from the database into plain values (the templates only format them).

Everything from the database is data to display, never markup: the templates escape it and the charts draw it on a
canvas. Job results are JSON written by the job kinds (``service.optimize.optimize_job``, ``service.crawl_run``), so
each field is checked for its type before use; a malformed one shows as missing instead of breaking the page.
"""

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session

from db.models import Device, Job, Measurement, Model, ModelSubgraph, Subgraph
from db.repositories.jobs import LOCK_STATUS
from db.repositories.stats import Coverage, coverage


@dataclass(frozen=True)
class KindDeviceMatrix:
    """Subgraphs with at least one ok measurement, per subgraph kind (rows) and device (columns)."""

    kinds: list[str]
    devices: list[str]
    counts: dict[tuple[str, str], int]

    def count(self, kind: str, device: str) -> int:
        return self.counts.get((kind, device), 0)


@dataclass(frozen=True)
class ModelRow:
    id: int
    name: str
    source: str | None
    subgraphs: int
    created_at: dt.datetime | None


@dataclass(frozen=True)
class Overview:
    coverage: Coverage
    matrix: KindDeviceMatrix
    models: list[ModelRow]
    jobs: list["JobRow"]


@dataclass(frozen=True)
class JobRow:
    id: int
    kind: str
    status: str
    progress: float
    model: str | None
    device: str | None
    speedup: float | None  # the whole model's, eager time over the plan's (optimize jobs that timed it)
    summary: str  # one line: what the job did, or why it failed
    created_at: dt.datetime | None
    finished_at: dt.datetime | None


@dataclass(frozen=True)
class SubgraphRow:
    name: str
    kind: str
    source: str
    choice: str
    recipe: str | None
    occurrences: int | None
    eager_s: float | None
    kernel_s: float | None
    speedup: float | None
    queued: bool


@dataclass(frozen=True)
class JobDetail:
    row: JobRow
    params: dict[str, Any]
    error: str | None
    backend: str | None = None
    toolchain: str | None = None
    model_s: float | None = None
    eager_model_s: float | None = None
    compile_model_s: float | None = None
    model_fallback: bool = False
    stages_s: dict[str, float] = field(default_factory=dict)
    subgraphs: list[SubgraphRow] = field(default_factory=list)
    result: dict[str, Any] | None = None  # other kinds' results, shown as they are


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _report(job: Job) -> dict[str, Any]:
    return _dict(_dict(job.result).get("report"))


def _summary(job: Job) -> str:
    if job.error:
        return job.error.strip().splitlines()[-1] if job.error.strip() else "failed"
    result, report = _dict(job.result), _report(job)
    if job.kind == "optimize" and report:
        rows = [_dict(s) for s in report.get("subgraphs") or [] if isinstance(s, dict)]
        kernels = sum(1 for s in rows if s.get("choice") == "kernel")
        text = f"{kernels} of {len(rows)} subgraphs run a tuned kernel"
        return text + (" (the plan lost as a whole: eager)" if report.get("model_fallback") is True else "")
    if job.kind == "crawl" and "subgraphs" in result:
        tuned, planned, measured = (_count(result.get(k)) for k in ("tuned", "subgraphs", "measured"))
        return f"tuned {tuned} of {planned} subgraphs, {measured} measurements"
    return ""


def job_row(job: Job) -> JobRow:
    params, report = _dict(job.params), _report(job)
    model = _text(params.get("model")) or _text(report.get("model"))
    if model is None and isinstance(params.get("models"), list):
        model = ", ".join(m for m in params["models"] if isinstance(m, str)) or None
    return JobRow(
        id=job.id, kind=job.kind, status=job.status, progress=_number(job.progress) or 0.0, model=model,
        device=_text(report.get("device")) or _text(_dict(job.result).get("device")),
        speedup=_number(report.get("speedup")), summary=_summary(job), created_at=job.created_at,
        finished_at=job.finished_at,
    )


def _subgraph_row(data: dict[str, Any]) -> SubgraphRow:
    return SubgraphRow(
        name=_text(data.get("name")) or "?", kind=_text(data.get("kind")) or "?",
        source=_text(data.get("source")) or "?", choice=_text(data.get("choice")) or "?",
        recipe=_text(data.get("recipe")), occurrences=_count(data.get("occurrences")),
        eager_s=_number(data.get("eager_s")), kernel_s=_number(data.get("kernel_s")),
        speedup=_number(data.get("speedup")), queued=data.get("queued") is True,
    )


def job_detail(job: Job) -> JobDetail:
    report = _report(job)
    base = JobDetail(row=job_row(job), params=_dict(job.params), error=job.error)
    if not report:
        result = {k: v for k, v in _dict(job.result).items() if k != "checkpoint"}
        return JobDetail(row=base.row, params=base.params, error=base.error, result=result or None)
    stages = {k: v for k, v in _dict(report.get("stages_s")).items() if _number(v) is not None}
    return JobDetail(
        row=base.row, params=base.params, error=base.error, backend=_text(report.get("backend")),
        toolchain=_text(report.get("toolchain")), model_s=_number(report.get("model_s")),
        eager_model_s=_number(report.get("eager_model_s")), compile_model_s=_number(report.get("compile_model_s")),
        model_fallback=report.get("model_fallback") is True, stages_s=stages,
        subgraphs=[_subgraph_row(s) for s in report.get("subgraphs") or [] if isinstance(s, dict)],
    )


def recent_jobs(session: Session, limit: int) -> list[JobRow]:
    """The newest jobs first (the lock rows that share the jobs table are left out)."""
    query = select(Job).where(Job.status != LOCK_STATUS).order_by(Job.id.desc()).limit(limit)
    return [job_row(job) for job in session.scalars(query)]


def get_job(session: Session, job_id: int) -> Job | None:
    job = session.get(Job, job_id)
    return job if job is not None and job.status != LOCK_STATUS else None


def kind_device_matrix(session: Session) -> KindDeviceMatrix:
    rows = session.execute(
        select(Subgraph.kind, Device.name, func.count(distinct(Measurement.subgraph_id)))
        .join(Subgraph, Subgraph.id == Measurement.subgraph_id)
        .join(Device, Device.id == Measurement.device_id)
        .where(Measurement.ok)
        .group_by(Subgraph.kind, Device.name)
    ).all()
    counts = {(kind, device): int(n) for kind, device, n in rows}
    kinds = sorted(session.scalars(select(Subgraph.kind).distinct()))
    devices = sorted(session.scalars(select(Device.name)))
    return KindDeviceMatrix(kinds=kinds, devices=devices, counts=counts)


def recent_models(session: Session, limit: int) -> list[ModelRow]:
    sizes = (select(ModelSubgraph.model_id, func.count().label("n")).group_by(ModelSubgraph.model_id).subquery())
    rows = session.execute(
        select(Model.id, Model.name, Model.source, func.coalesce(sizes.c.n, 0), Model.created_at)
        .outerjoin(sizes, sizes.c.model_id == Model.id)
        .order_by(Model.id.desc())
        .limit(limit)
    )
    return [ModelRow(model_id, name, source, int(n), created) for model_id, name, source, n, created in rows]


def overview(session: Session, *, jobs: int, models: int) -> Overview:
    return Overview(coverage=coverage(session), matrix=kind_device_matrix(session),
                    models=recent_models(session, models), jobs=recent_jobs(session, jobs))
