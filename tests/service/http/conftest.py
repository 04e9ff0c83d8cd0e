"""The app in-process over a fresh SQLite database (jobs left in the table unless a test runs them), and API keys."""

import os
import secrets
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient` is deprecated")
from fastapi.testclient import TestClient  # noqa: E402

from db.migrate import upgrade  # noqa: E402
from db.repositories.api_keys import issue_api_key  # noqa: E402
from db.session import Database  # noqa: E402
from service.http.app import create_app  # noqa: E402
from service.http.config import ServerConfig  # noqa: E402

os.environ.setdefault("OMP_NUM_THREADS", "1")


@dataclass
class Api:
    client: TestClient
    database: Database
    config: ServerConfig

    def key(self, *scopes: str, name: str = "test") -> dict[str, str]:
        """Headers with a new key of ``scopes``; the key's id is in ``headers['x-key-id']`` (not sent)."""
        with self.database.scope() as session:
            key, secret = issue_api_key(session, name=name, scopes=scopes)
            key_id = key.id
        return {"Authorization": f"Bearer {secret}", "x-key-id": str(key_id)}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database on each backend: an SQLite file, or a new schema on the local PostgreSQL server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tunebank.db'}"
        return
    import psycopg

    from tests.db.conftest import PG_SERVER, _require_postgres, pg_url

    _require_postgres()
    schema = f"tb_http_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(PG_SERVER, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    yield pg_url(schema)
    with psycopg.connect(PG_SERVER, autocommit=True) as connection:
        connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def make_api(tmp_path: Path, database_url: str) -> Iterator[Callable[..., Api]]:
    """``make_api(**config) -> Api``: the app over the migrated database of ``database_url`` (shared by every app
    the test makes), files in ``tmp_path``."""
    made: list[tuple[TestClient, Database]] = []

    def make(**overrides: object) -> Api:
        database = Database(database_url)
        upgrade(database.engine)
        config = ServerConfig(database_url=database.url, data_dir=tmp_path, index_dir=tmp_path / "index",
                              executor="none", backend="cpu", open_access=False)
        config = replace(config, **overrides)  # type: ignore[arg-type]
        client = TestClient(create_app(config, database=database), raise_server_exceptions=False)
        client.__enter__()
        made.append((client, database))
        return Api(client, database, config)

    yield make
    for client, database in made:
        client.__exit__(None, None, None)
        database.dispose()


@pytest.fixture
def api(make_api: Callable[..., Api]) -> Api:
    return make_api()
