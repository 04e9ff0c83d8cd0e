"""Fetch one row by primary key, or raise ``NotFoundError`` naming what was missing."""

from typing import TypeVar

from sqlalchemy.orm import Session

from db.errors import NotFoundError

T = TypeVar("T")


def get_or_raise(session: Session, model: type[T], row_id: int, what: str) -> T:
    row = session.get(model, row_id)
    if row is None:
        raise NotFoundError(f"no {what} with id {row_id}")
    return row
