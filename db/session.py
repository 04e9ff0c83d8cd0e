"""Engines and sessions for SQLite (WAL) and PostgreSQL (psycopg 3) from one URL; the caller owns the transaction.

database = Database("sqlite:////data/tunebank.db")   # or "postgresql://user@host/dbname"
with database.scope() as session:                      # commits on success, rolls back on error
    ingest_measurements(session, records)              # repositories only flush
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker

from db.errors import DbError

SQLITE_BUSY_TIMEOUT_MS = 30_000


def normalize_url(url: str) -> str:
    """Pick the psycopg 3 driver for plain ``postgresql://`` URLs; reject backends other than SQLite and PostgreSQL."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise DbError(f"invalid database URL {url!r}; expected sqlite:///PATH or postgresql://USER@HOST/DB") from None
    if parsed.get_backend_name() == "postgresql":
        return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    if parsed.get_backend_name() == "sqlite":
        return url
    raise DbError(f"unsupported database backend {parsed.get_backend_name()!r}; use sqlite or postgresql")


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url``; SQLite files get WAL mode, foreign keys and a busy timeout, and their folder is made."""
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql":
        return create_engine(url, pool_pre_ping=True, **kwargs)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **kwargs)
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.close()


class Database:
    """An engine and its session factory. ``scope()`` is the one place where transactions commit."""

    def __init__(self, url: str, **engine_kwargs: Any) -> None:
        self.url = normalize_url(url)
        self.engine = make_engine(self.url, **engine_kwargs)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def backend(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def scope(self) -> Iterator[Session]:
        """A session whose transaction commits when the block ends and rolls back when it raises."""
        with self.sessions() as session, session.begin():
            yield session

    def dispose(self) -> None:
        self.engine.dispose()
