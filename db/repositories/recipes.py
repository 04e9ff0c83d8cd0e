"""Recipes, stored by their canonical string (formatted by ``transforms``; never parsed here)."""

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.errors import InvalidRecordError
from db.models import Recipe
from db.repositories._insert import insert_ignore, pages

MAX_LENGTH = Recipe.__table__.c.canonical.type.length


def ensure_recipes(session: Session, canonicals: Iterable[str]) -> dict[str, int]:
    """Ids of the given recipes, adding the new ones."""
    wanted = sorted(set(canonicals))
    for canonical in wanted:
        if not canonical or len(canonical) > MAX_LENGTH:
            raise InvalidRecordError(f"recipe string must have 1 to {MAX_LENGTH} characters, got {len(canonical)}")
    ids: dict[str, int] = {}
    statement = insert_ignore(session, Recipe.__table__, ["canonical"])
    for page in pages(wanted):
        session.execute(statement, [{"canonical": c} for c in page])
        ids.update(session.execute(select(Recipe.canonical, Recipe.id).where(Recipe.canonical.in_(page))).all())
    return ids
