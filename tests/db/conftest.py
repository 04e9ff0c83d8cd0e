"""Fixtures for the db tests: every test runs against SQLite and PostgreSQL.

PostgreSQL: the server on 127.0.0.1:5432 (database ``test``). Each test run gets its own schema, migrated once and
emptied after each test, so concurrent runs never collide. When the server is down the PostgreSQL tests skip,
except under CI (``CI=true``), where they fail.
"""

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text

from db.migrate import upgrade
from db.models import Base
from db.repositories.devices import DeviceIn, upsert_device
from db.repositories.subgraphs import SubgraphIn, add_subgraphs
from db.session import Database

PG_SERVER = os.environ.get("TUNEBANK_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def pg_url(schema: str) -> str:
    return f"{PG_SERVER}?options=-csearch_path%3D{schema}"


def _require_postgres() -> None:
    try:
        psycopg.connect(PG_SERVER, connect_timeout=3).close()
    except psycopg.OperationalError as e:
        reason = f"PostgreSQL at {PG_SERVER} is unreachable: {str(e).strip().splitlines()[0]}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_schema_factory() -> Iterator:
    """Makes uniquely named schemas on the server; drops them all when the run ends."""
    made: list[str] = []

    def make(tag: str = "run") -> str:
        _require_postgres()
        name = f"tb_{tag}_{os.getpid()}_{secrets.token_hex(4)}"
        with psycopg.connect(PG_SERVER, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        made.append(name)
        return name

    yield make
    if made:
        with psycopg.connect(PG_SERVER, autocommit=True) as conn:
            for name in made:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture(scope="session")
def pg_fresh_url(pg_schema_factory):
    """``pg_fresh_url(tag) -> URL`` of a new, empty schema (dropped when the run ends)."""
    return lambda tag: pg_url(pg_schema_factory(tag))


@pytest.fixture(scope="session")
def pg_database(pg_schema_factory) -> Iterator[Database]:
    database = Database(pg_url(pg_schema_factory()))
    upgrade(database.engine)
    yield database
    database.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database(request, tmp_path: Path) -> Iterator[Database]:
    """A migrated, empty database on each backend."""
    if request.param == "sqlite":
        database = Database(f"sqlite:///{tmp_path / 'tunebank.db'}")
        upgrade(database.engine)
        yield database
        database.dispose()
        return
    database = request.getfixturevalue("pg_database")
    yield database
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with database.engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))


@pytest.fixture
def sqlite_database(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'tunebank.db'}")
    upgrade(database.engine)
    yield database
    database.dispose()


KINDS = ("pointwise", "reduction", "contraction")


@dataclass(frozen=True)
class Seeded:
    device_id: int
    hashes: list[str]  # structural hashes, in order
    ids: list[int]  # their subgraph ids
    kinds: list[str]


def _seed(database: Database, n_subgraphs: int = 10, device: str = "h100") -> Seeded:
    """A device and ``n_subgraphs`` subgraphs whose kinds cycle through ``KINDS``."""
    hashes = [f"{i:064x}" for i in range(n_subgraphs)]
    kinds = [KINDS[i % len(KINDS)] for i in range(n_subgraphs)]
    with database.scope() as session:
        device_id = upsert_device(session, DeviceIn(device, "cuda:sm_90", "sm_90", 3350.0, 989.0)).id
        records = [
            SubgraphIn(h, f"{i % 3:064x}", kinds[i], '{"nodes": []}', {"flops": float(i)}) for i, h in enumerate(hashes)
        ]
        ids = add_subgraphs(session, records)
    return Seeded(device_id, hashes, [ids[h] for h in hashes], kinds)


@pytest.fixture
def seed():
    """``seed(database, n_subgraphs=10, device="h100") -> Seeded``."""
    return _seed
