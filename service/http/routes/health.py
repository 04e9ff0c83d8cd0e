"""``/healthz`` (the process answers), ``/readyz`` (database reachable at the code's schema, index folder usable),
``/metrics`` (Prometheus). None needs a key: they say nothing about any user's work."""

import os

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from db.migrate import check_schema
from service.http.errors import error_response
from service.http.state import StateDep

router = APIRouter(tags=["health"])


@router.get("/healthz", operation_id="healthz")
def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz", operation_id="readyz", responses={503: {"description": "not ready, with the reason"}})
def readyz(state: StateDep) -> JSONResponse:
    problems = []
    try:
        with state.database.engine.connect() as connection:
            connection.execute(text("select 1"))
        check_schema(state.database.engine)
    except Exception as e:  # noqa: BLE001 (any driver or schema failure is a reason not to be ready)
        problems.append(f"database: {str(e).splitlines()[0][:300] if str(e) else type(e).__name__}")
    folder = state.config.index_dir
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.R_OK | os.W_OK | os.X_OK):
            raise PermissionError("not readable and writable")
    except OSError as e:
        problems.append(f"index folder {folder}: {e.strerror or e}")
    if problems:
        return error_response(503, "not ready", "; ".join(problems))
    return JSONResponse({"status": "ready"})


@router.get("/metrics", operation_id="metrics", response_class=Response)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
