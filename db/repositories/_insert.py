"""``INSERT ... ON CONFLICT DO NOTHING`` for SQLite and PostgreSQL, in pages that stay under parameter limits."""

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import Insert, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

T = TypeVar("T")
PAGE = 1000


def pages(items: Sequence[T], size: int = PAGE) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def insert_ignore(session: Session, table: Table, conflict: Sequence[str]) -> Insert:
    """An insert into ``table`` that skips rows whose ``conflict`` columns already exist (no error, no update)."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return insert(table).on_conflict_do_nothing(index_elements=list(conflict))


def insert_ignore_count(
    session: Session, table: Table, conflict: Sequence[str], rows: Sequence[Mapping[str, Any]]
) -> int:
    """Insert ``rows`` skipping duplicates; returns how many were new."""
    statement = insert_ignore(session, table, conflict).returning(table.c.id)
    return sum(len(session.execute(statement, list(page)).all()) for page in pages(rows))
