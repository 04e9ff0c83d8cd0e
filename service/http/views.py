"""Jobs as the API shows them: status, progress, and when an optimize job is done its report with the whole model's
plan and eager times side by side."""

import datetime as dt
from typing import Any

from db.models import Job
from db.repositories.jobs import JobStatus
from service.strict_json import finite


def _time(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).isoformat()


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The whole model's times (plan vs eager) and the subgraphs by source and choice."""
    counts: dict[str, int] = {}
    for row in report.get("subgraphs") or []:
        key = row.get("source") if row.get("source") == "not tunable" else f"{row.get('source')}, {row.get('choice')}"
        counts[str(key)] = counts.get(str(key), 0) + 1
    return {"model_s": report.get("model_s"), "eager_model_s": report.get("eager_model_s"),
            "speedup": report.get("speedup"), "model_fallback": report.get("model_fallback"), "subgraphs": counts}


def job_view(job: Job) -> dict[str, Any]:
    params = job.params or {}
    done = job.status == JobStatus.SUCCEEDED
    report = (job.result or {}).get("report") if done else None
    if isinstance(report, dict) and params.get("filename"):  # the name the client sent, not the server's path
        report = {**report, "model": params["filename"]}
    view: dict[str, Any] = {
        "id": job.id, "kind": job.kind, "status": job.status, "progress": job.progress, "error": job.error,
        "attempts": job.attempts, "model": params.get("filename") or params.get("model"),
        "created_at": _time(job.created_at), "started_at": _time(job.started_at),
        "finished_at": _time(job.finished_at),
        "summary": summary(report) if isinstance(report, dict) else None, "report": report,
        "plan_url": f"/v1/jobs/{job.id}/plan" if done and (job.result or {}).get("plan") else None,
    }
    return finite(view)
