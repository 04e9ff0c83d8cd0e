"""``INSERT ... ON CONFLICT DO NOTHING`` for SQLite and PostgreSQL, in pages that stay under parameter limits.

On PostgreSQL, bulk rows are COPYed into a temporary staging table (in the caller's transaction) and moved with
one ``INSERT ... SELECT ... ORDER BY key ON CONFLICT DO NOTHING`` (one lock order for every writer, so concurrent
writers never deadlock): a VALUES list with thousands of parameters costs more to plan
than to run. The staging table empties itself at commit.
"""

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import Insert, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

T = TypeVar("T")
PAGE = 1000
PG_PAGE = 10_000


def pages(items: Sequence[T], size: int = PAGE) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def insert_ignore(session: Session, table: Table, conflict: Sequence[str]) -> Insert:
    """An insert into ``table`` that skips rows whose ``conflict`` columns already exist (no error, no update)."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return insert(table).on_conflict_do_nothing(index_elements=list(conflict))


def insert_ignore_count(
    session: Session, table: Table, conflict: Sequence[str], columns: Sequence[str], rows: Sequence[tuple[Any, ...]]
) -> int:
    """Insert ``rows`` (tuples of ``columns``) skipping duplicates; returns how many were new."""
    if not rows:
        return 0
    if session.get_bind().dialect.name == "postgresql":
        return sum(_pg_copy_insert(session, table, conflict, columns, page) for page in pages(rows, PG_PAGE))
    statement = insert_ignore(session, table, conflict).returning(table.c.id)
    return sum(
        len(session.execute(statement, [dict(zip(columns, row, strict=True)) for row in page]).all())
        for page in pages(rows)
    )


def _pg_copy_insert(
    session: Session, table: Table, conflict: Sequence[str], columns: Sequence[str], rows: Sequence[tuple[Any, ...]]
) -> int:
    names = ", ".join(f'"{name}"' for name in columns)
    key = ", ".join(f'"{name}"' for name in conflict)
    staging = f'"_ingest_{table.name}"'
    cursor = session.connection().connection.driver_connection.cursor()  # the session's own transaction
    with cursor:
        cursor.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {staging} ON COMMIT DELETE ROWS "
            f'AS SELECT {names} FROM "{table.name}" WITH NO DATA'
        )
        cursor.execute(f"TRUNCATE {staging}")
        with cursor.copy(f"COPY {staging} ({names}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        cursor.execute(
            f'INSERT INTO "{table.name}" ({names}) SELECT {names} FROM {staging} ORDER BY {key} '
            f"ON CONFLICT ({key}) DO NOTHING"
        )
        return cursor.rowcount
