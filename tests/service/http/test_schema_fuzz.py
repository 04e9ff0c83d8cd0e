"""Schemathesis against the OpenAPI schema: requests generated from every operation's schema (valid and not) never
get a 500. The app is open (loopback, no key yet) over an SQLite database holding one queued job."""

import tempfile
import warnings
from pathlib import Path

import pytest

warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient` is deprecated")
schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is in the dev extra")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

from db.migrate import upgrade  # noqa: E402
from db.repositories import jobs  # noqa: E402
from db.session import Database  # noqa: E402
from service.http.app import create_app  # noqa: E402
from service.http.config import ServerConfig  # noqa: E402

_folder = Path(tempfile.mkdtemp(prefix="tunebank-fuzz-"))
_database = Database(f"sqlite:///{_folder / 'tunebank.db'}")
upgrade(_database.engine)
with _database.scope() as _session:
    jobs.enqueue(_session, "optimize", {"model": "x.json", "filename": "x.json"})
_app = create_app(ServerConfig(database_url=_database.url, data_dir=_folder, index_dir=_folder / "index",
                               executor="none", backend="cpu", open_access=True, max_model_bytes=2**20,
                               request_timeout_s=30), database=_database)
schema = schemathesis.openapi.from_asgi("/openapi.json", _app)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_request_gets_a_500(case) -> None:
    case.call_and_validate(checks=[not_a_server_error])
