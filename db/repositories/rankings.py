"""Queries over measurements: best recipe per subgraph and device, top-k recipes, one recipe across subgraphs."""

from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from db.models import Measurement, Recipe, Subgraph
from db.repositories._insert import pages


@dataclass(frozen=True)
class RecipeTiming:
    subgraph_id: int
    device_id: int
    recipe_id: int
    recipe: str
    toolchain: str
    median_s: float
    spread_s: float | None
    repeats: int


@dataclass(frozen=True)
class RecipeOutcome:
    """One measurement of a recipe, with the subgraph's kind and family (for learning transferability)."""

    subgraph_id: int
    kind: str
    family_hash: str
    device_id: int
    toolchain: str
    ok: bool
    error_kind: str | None
    median_s: float | None


def _ranked(device_id: int, toolchain: str | None, partition: tuple) -> Select:
    """Ok measurements on a device with their rank (1 = fastest, ties broken by recipe id) within ``partition``."""
    rank = func.row_number().over(partition_by=partition, order_by=(Measurement.median_s, Measurement.recipe_id))
    query = select(Measurement, rank.label("rank")).where(Measurement.device_id == device_id, Measurement.ok)
    if toolchain is not None:
        query = query.where(Measurement.toolchain == toolchain)
    return query


def _timings(session: Session, ranked: Select, limit: int | None = None) -> list[RecipeTiming]:
    sub = ranked.subquery()
    query = (
        select(
            sub.c.subgraph_id,
            sub.c.device_id,
            sub.c.recipe_id,
            Recipe.canonical,
            sub.c.toolchain,
            sub.c.median_s,
            sub.c.spread_s,
            sub.c.repeats,
        )
        .join(Recipe, Recipe.id == sub.c.recipe_id)
        .where(sub.c.rank == 1)
        .order_by(sub.c.subgraph_id, sub.c.median_s, sub.c.recipe_id)
        .limit(limit)
    )
    return [RecipeTiming(*row) for row in session.execute(query)]


def best_recipes(
    session: Session, *, device_id: int, subgraph_ids: Collection[int], toolchain: str | None = None
) -> dict[int, RecipeTiming]:
    """The fastest ok recipe of each subgraph on a device (subgraphs without one are absent)."""
    best: dict[int, RecipeTiming] = {}
    for page in pages(sorted(set(subgraph_ids))):
        ranked = _ranked(device_id, toolchain, (Measurement.subgraph_id,)).where(Measurement.subgraph_id.in_(page))
        best.update((t.subgraph_id, t) for t in _timings(session, ranked))
    return best


def top_k_recipes(
    session: Session, *, subgraph_id: int, device_id: int, k: int, toolchain: str | None = None
) -> list[RecipeTiming]:
    """The ``k`` fastest distinct ok recipes of a subgraph on a device, fastest first (each at its best toolchain)."""
    ranked = _ranked(device_id, toolchain, (Measurement.recipe_id,)).where(Measurement.subgraph_id == subgraph_id)
    return _timings(session, ranked, limit=k)


def recipe_outcomes(session: Session, recipe: str, *, device_id: int | None = None) -> list[RecipeOutcome]:
    """Every measurement of one recipe (by canonical string) across subgraphs, failures included."""
    query = (
        select(
            Measurement.subgraph_id,
            Subgraph.kind,
            Subgraph.family_hash,
            Measurement.device_id,
            Measurement.toolchain,
            Measurement.ok,
            Measurement.error_kind,
            Measurement.median_s,
        )
        .join(Recipe, Recipe.id == Measurement.recipe_id)
        .join(Subgraph, Subgraph.id == Measurement.subgraph_id)
        .where(Recipe.canonical == recipe)
        .order_by(Measurement.subgraph_id, Measurement.device_id, Measurement.toolchain)
    )
    if device_id is not None:
        query = query.where(Measurement.device_id == device_id)
    return [RecipeOutcome(*row) for row in session.execute(query)]


def stored_results(session: Session, *, subgraph_id: int, device_id: int, toolchain: str) -> dict[str, float | str]:
    """Every recipe measured on a subgraph for a device and toolchain: canonical string -> median seconds, or the
    error kind of a failure (what a measurer's table holds, so an interrupted run resumes without re-measuring)."""
    query = (select(Recipe.canonical, Measurement.ok, Measurement.median_s, Measurement.error_kind)
             .join(Recipe, Recipe.id == Measurement.recipe_id)
             .where(Measurement.subgraph_id == subgraph_id, Measurement.device_id == device_id,
                    Measurement.toolchain == toolchain))
    return {recipe: (median if ok and median is not None else str(error)) for recipe, ok, median, error
            in session.execute(query)}
