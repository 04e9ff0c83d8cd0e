"""Subgraphs, stored by structural hash with their canonical IR (validated JSON text) and static features."""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.errors import InvalidRecordError
from db.models import Subgraph
from db.repositories._get import get_or_raise
from db.repositories._insert import insert_ignore, pages


@dataclass(frozen=True)
class SubgraphIn:
    structural_hash: str
    family_hash: str
    kind: str
    ir_json: str
    features: dict[str, Any] | None = field(default=None)


def add_subgraphs(session: Session, records: Sequence[SubgraphIn]) -> dict[str, int]:
    """Ids by structural hash; subgraphs already stored are kept as they are."""
    rows = [vars(r) for r in records]
    statement = insert_ignore(session, Subgraph.__table__, ["structural_hash"])
    for page in pages(rows):
        session.execute(statement, list(page))
    return subgraph_ids(session, [r.structural_hash for r in records])


def subgraph_ids(session: Session, hashes: Iterable[str]) -> dict[str, int]:
    """Ids of the given structural hashes; raises ``InvalidRecordError`` naming one that is not stored."""
    wanted = sorted(set(hashes))
    ids: dict[str, int] = {}
    for page in pages(wanted):
        query = select(Subgraph.structural_hash, Subgraph.id).where(Subgraph.structural_hash.in_(page))
        ids.update(session.execute(query).all())
    missing = [h for h in wanted if h not in ids]
    if missing:
        raise InvalidRecordError(f"unknown subgraph {missing[0]!r} ({len(missing)} unknown); add the subgraphs first")
    return ids


def get_subgraph(session: Session, subgraph_id: int) -> Subgraph:
    return get_or_raise(session, Subgraph, subgraph_id, "subgraph")


def get_subgraphs(session: Session, subgraph_ids: Iterable[int]) -> dict[int, Subgraph]:
    wanted = sorted(set(subgraph_ids))
    found: dict[int, Subgraph] = {}
    for page in pages(wanted):
        found.update((s.id, s) for s in session.scalars(select(Subgraph).where(Subgraph.id.in_(page))))
    return found
