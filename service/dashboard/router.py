"""The dashboard's routes: server-rendered pages (Jinja2, autoescaped) and their static files."""

import mimetypes
from collections.abc import Sequence
from dataclasses import asdict, astuple
from pathlib import Path
from typing import Annotated, Any

import jinja2
from fastapi import APIRouter, Query, params
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, HTMLResponse, Response

from db.repositories.embeddings import IndexKey
from db.session import Database
from service.dashboard import embedding_map as emap
from service.dashboard import views
from service.strict_json import strict_json

HERE = Path(__file__).parent
STATIC = HERE / "static"
# Scripts and styles come only from the dashboard's own static files; chart data is JSON in non-executed
# <script type="application/json"> blocks, so nothing from the database can run even if escaping were missed.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
MAX_ID = 2**63 - 1


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.policies["json.dumps_function"] = lambda value, **_: strict_json(value, indent=None)  # NaN -> null
    env.filters["seconds"] = _seconds
    env.filters["json"] = lambda value: strict_json(value, indent=None)  # a str: autoescaped like any other
    env.filters["times"] = lambda value: "—" if value is None else f"{value:.2f}x"
    env.filters["when"] = lambda value: "—" if value is None else value.strftime("%Y-%m-%d %H:%M")
    return env


def _seconds(value: float | None) -> str:
    if value is None:
        return "—"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def dashboard_router(database: Database, *, prefix: str = "", dependencies: Sequence[params.Depends] = (),
                     max_jobs: int = 50, max_models: int = 20, max_points: int = 5000) -> APIRouter:
    """The web dashboard over ``database``, as a router to include in an app (``app.include_router(...)``).

    Pages: ``/`` (coverage, recent models and jobs), ``/jobs/{id}`` (a job and its per-subgraph report), ``/map``
    (the embedding space in 2-D). They show every job and model in the database: when the app is reachable by more
    than its operator, pass an authentication dependency in ``dependencies``. It guards the pages only: the static
    files (``/static/dashboard/...``: Chart.js, the stylesheet, the script) are the package's own, hold no data and
    are public, so loading them costs no request of a key's rate limit. ``prefix`` mounts the pages below a path
    (e.g. ``/dashboard``). Pages are left out of the OpenAPI schema."""
    env = _environment()
    statics = {p.relative_to(STATIC).as_posix(): p for p in STATIC.rglob("*") if p.is_file()}
    router = APIRouter(prefix=prefix, include_in_schema=False)
    guarded = list(dependencies)

    def page(template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(template).render(base=prefix, **context)
        return HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)

    @router.get("/", response_class=HTMLResponse, name="dashboard_home", dependencies=guarded)
    def home() -> HTMLResponse:
        with database.scope() as session:
            data = views.overview(session, jobs=max_jobs, models=max_models)
        return page("index.html", view=data)

    @router.get("/jobs/{job_id}", response_class=HTMLResponse, name="dashboard_job", dependencies=guarded)
    def job(job_id: Annotated[int, PathParam(ge=1, le=MAX_ID)]) -> HTMLResponse:
        with database.scope() as session:
            row = views.get_job(session, job_id)
            detail = views.job_detail(row) if row is not None else None
        if detail is None:
            return page("missing.html", 404, what=f"job {job_id}")
        chart = {"labels": [s.name for s in detail.subgraphs],
                 "eager": [s.eager_s for s in detail.subgraphs], "tuned": [s.kernel_s for s in detail.subgraphs]}
        return page("job.html", job=detail, chart=chart)

    @router.get("/map", response_class=HTMLResponse, name="dashboard_map", dependencies=guarded)
    def embedding_space(device_class: Annotated[str | None, Query(max_length=100)] = None,
                        encoder: Annotated[str | None, Query(max_length=100)] = None,
                        version: Annotated[str | None, Query(max_length=50)] = None) -> HTMLResponse:
        with database.scope() as session:
            keys = emap.index_keys(session)
            asked = (device_class, encoder, version)  # None: any; the largest index that matches is shown
            chosen = next((k for k in keys if all(a in (None, b) for a, b in zip(asked, astuple(k.key), strict=True))),
                          None)
            space = None if chosen is None else emap.embedding_map(session, chosen.key, chosen.embeddings,
                                                                   max_points=max_points)
        if space is None and keys:  # a key that has no embeddings
            missing = IndexKey(device_class or "", encoder or "", version or "")
            return page("map.html", 404, keys=keys, space=None, points=[], missing=missing)
        points = [asdict(p) for p in space.points] if space else []
        return page("map.html", keys=keys, space=space, points=points, missing=None)

    @router.get("/static/dashboard/{name:path}", name="dashboard_static")
    def static(name: str) -> Response:
        path = statics.get(name)  # only the files shipped in static/: no path from the request reaches the disk
        if path is None:
            return Response("not found", status_code=404, media_type="text/plain")
        media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        return FileResponse(path, media_type=media_type, headers={"Cache-Control": "public, max-age=3600",
                                                                  "X-Content-Type-Options": "nosniff"})

    return router
