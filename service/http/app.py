"""The app factory: routes under ``/v1``, health and metrics, the error handler, the request limits, and (on start)
the database and the job executor the config names. The web dashboard (``service.dashboard``) is mounted at ``/``
behind the ``admin`` scope, with HTTP Basic sign-in for browsers (``require("admin", browser=True)``), when that
package is installed.

    app = create_app(ServerConfig(database_url="sqlite:////data/tunebank.db", data_dir=Path("/data"), ...))
    uvicorn.run(app, host="127.0.0.1", port=8000)
"""

import contextlib
import importlib.util
import logging
import threading
from collections.abc import AsyncIterator

from fastapi import FastAPI

from db.session import Database
from service.http.auth import require
from service.http.config import ServerConfig
from service.http.errors import install_error_handlers
from service.http.limits import BodyLimit, Timeout
from service.http.metrics import Metrics
from service.http.ratelimit import RateLimiter
from service.http.routes import health, jobs, measurements, optimize, stats, subgraphs
from service.http.state import AppState
from service.jobs import Executor, JobContext

log = logging.getLogger(__name__)
UPLOAD_OVERHEAD = 2**20  # multipart boundaries and form fields around the model's bytes
STOP_WAIT_S = 5.0  # a job still running at shutdown is resumed by the next executor (its lease expires)
API_VERSION = "1"


def create_app(config: ServerConfig, *, database: Database | None = None) -> FastAPI:
    """The API over ``config``'s database (or ``database``, which the caller then disposes of)."""
    owned = database is None
    database = database or Database(config.database_url)
    state = AppState(config, database, RateLimiter(config.rate_limit_per_minute))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        executor = _start_jobs(state)
        try:
            yield
        finally:
            if executor is not None:
                stopping = threading.Thread(target=executor.stop, daemon=True)
                stopping.start()
                stopping.join(STOP_WAIT_S)
            if owned:
                database.dispose()

    app = FastAPI(title="tunebank", version=API_VERSION, lifespan=lifespan,
                  description="Transfer tuning as a service: send a model, get a plan. Authenticate with "
                              "'Authorization: Bearer <key>' (`tunebank keys create`).")
    app.state.tunebank = state
    app.state.metrics = Metrics(database)
    install_error_handlers(app)
    for module in (optimize, jobs, subgraphs, measurements, stats, health):
        app.include_router(module.router)
    _mount_dashboard(app, database)
    app.add_middleware(BodyLimit, limit_for=lambda path: (config.max_model_bytes + UPLOAD_OVERHEAD
                                                          if path == "/v1/optimize" else config.max_request_bytes))
    app.add_middleware(Timeout, timeout_s=config.request_timeout_s)
    app.add_middleware(app.state.metrics.middleware)
    return app


def _start_jobs(state: AppState) -> Executor | None:
    config = state.config
    if config.executor == "celery":
        from service.jobs_celery import celery_app

        state.celery = celery_app(config.broker_url)
        return None
    if config.executor != "embedded":
        return None
    executor = Executor(JobContext(state.database, config.data_dir, config.index_dir), kinds=["optimize"],
                        lease_s=config.job_lease_s)
    executor.start(poll_s=config.executor_poll_s)
    return executor


def _mount_dashboard(app: FastAPI, database: Database) -> None:
    if importlib.util.find_spec("service.dashboard") is None:
        return
    try:
        from service.dashboard import dashboard_router
    except ImportError as e:  # its own dependencies (Jinja2) are not installed
        log.warning("the web dashboard is not served: %s", e)
        return
    app.include_router(dashboard_router(database, dependencies=[require("admin", browser=True)]))
