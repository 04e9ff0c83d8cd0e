"""The transfer tuning step (strategy ``transfer``): embed the subgraph, take its k nearest neighbours of the
same kind on the same device class, adapt their best recipes (or each one's fastest few), validate and time them
against the default recipe (the baseline), keep the fastest; optionally hill-climb from it with a small budget.

Neighbours often give fewer distinct candidates than they are asked for (two adapt to the same recipe, a recipe
adapts to nothing, the database has no subgraph of the kind): with ``fill`` the remaining places of the
``k * per_neighbour`` candidates go first to the neighbours' recipes with each value of the knobs their own
subgraph has but their stored recipe lacks (crawled before the knob existed: ``Neighbour.newer_knobs``), then to
the vendor library's own ranked alternatives (``RecipeSpace.vendor_ranked``: e.g. cuBLASLt's heuristic algorithms
for a GEMM, chosen by NVIDIA's model of the device and compiling no kernel of ours), then to uniform random recipes
(:func:`random_recipes`), so that k buys the same number of measurements whatever the neighbours hold. Given a
``rank`` (a cost model's scores: ``service.cost_model``), the last places go instead to the best-ranked recipes of a
``pool`` of candidates (by default :data:`POOL` uniform random recipes), origin ``model``.

    result = transfer_tune(task, key, vector, session=s, index=index, device_id=d, measurer=m, backend="cpu", k=5)
    result.winner, result.winner_s, result.evaluations, [(n.distance, n.changes) for n in result.neighbours]
"""

import functools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy.orm import Session

from db.index import VectorIndex
from db.repositories.rankings import RecipeTiming, best_recipes, top_k_recipes
from embed.errors import EmbedError
from embed.ir import graph_from_json
from embed.lower import lower
from service.measure import Measurer
from transforms.adapt import adapt
from transforms.recipe import Recipe, parse
from transforms.results import RunResult
from transforms.search import create
from transforms.search.random_search import RandomSearch
from transforms.search.strategy import search
from transforms.space import RecipeSpace
from transforms.tune import Task

#: Candidates a cost model ranks for the fill when no pool is given: this many uniform random recipes.
POOL = 256
#: Scores recipes for one subgraph (higher: predicted faster), e.g. ``CostModel.predict`` with its features.
Rank = Callable[[Sequence[Recipe]], Sequence[float]]


@dataclass(frozen=True)
class Neighbour:
    """A neighbour in embedding space, one of its fastest recipes and that recipe adapted to the query subgraph."""

    subgraph_id: int
    structural_hash: str
    distance: float
    source_recipe: str
    recipe: str
    changes: tuple[str, ...]
    newer_knobs: tuple[str, ...] = ()  # knobs of its own space that its stored recipe lacks: added after the crawl
    lent_by: int | None = None  # the device whose measurement gave the recipe, when not the query's own


@dataclass(frozen=True)
class Tried:
    recipe: str
    result: RunResult
    origin: str  # "default", "neighbour", "variant", "vendor", "random" or "model" (fill), or "local"


@dataclass(frozen=True)
class TransferResult:
    """What was tried (in order, the default first), the neighbours, and the winner (the default when no
    candidate beat it). ``evaluations`` counts distinct recipes measured, the default included."""

    neighbours: tuple[Neighbour, ...]
    tried: tuple[Tried, ...]
    winner: str
    winner_s: float
    default_s: float

    @property
    def evaluations(self) -> int:
        return len(self.tried)

    @property
    def speedup(self) -> float:
        return self.default_s / self.winner_s


def neighbours(session: Session, index: VectorIndex, vector: np.ndarray, *, task: Task, device_id: int, k: int,
               backend: str, exclude: Collection[str] = (), per_neighbour: int = 1,
               lenders: Sequence[int] = ()) -> list[Neighbour]:
    """The ``k`` nearest subgraphs of the task's kind that have a measured recipe on the device, or else on the
    first of ``lenders`` (devices of its class: ``service.embeddings.profile_sources``) that has one
    (``exclude``: structural hashes to skip), each with its ``per_neighbour`` fastest recipes adapted to the task,
    nearest and fastest first. A recipe none of whose steps applies to the task (it adapts to nothing) is left out."""
    found = index.search(session, vector, k + len(exclude), kinds={task.kind})
    hits = [(row, d) for row, d in zip(found.subgraphs, found.distances, strict=True)
            if row.structural_hash not in exclude][:k]
    ranked: dict[int, list[RecipeTiming]] = {row.id: [] for row, _ in hits}
    lent_by: dict[int, int] = {}
    for device in (device_id, *lenders):
        missing = [i for i, timings in ranked.items() if not timings]
        if not missing:
            break
        if per_neighbour == 1:
            best = best_recipes(session, device_id=device, subgraph_ids=missing)
            found_here = {i: [best[i]] for i in missing if i in best}
        else:
            found_here = {i: top for i in missing
                          if (top := top_k_recipes(session, subgraph_id=i, device_id=device, k=per_neighbour))}
        ranked.update(found_here)
        if device != device_id:
            lent_by.update(dict.fromkeys(found_here, device))
    out = []
    for row, distance in hits:
        own = _own_space(row.ir_json, backend) if ranked[row.id] else None
        for timing in ranked[row.id]:
            stored = parse(timing.recipe)
            recipe, changes = adapt(stored, task.program, backend)
            if recipe:
                newer = tuple(sorted(own.unset_knobs(stored))) if own is not None else ()
                out.append(Neighbour(row.id, row.structural_hash, distance, timing.recipe, str(recipe),
                                     tuple(changes), newer, lent_by.get(row.id)))
    return out


@functools.lru_cache(maxsize=512)
def _own_space(ir_json: str, backend: str) -> RecipeSpace | None:
    """The recipe space of a stored subgraph; None where its document no longer loads (stored by an older IR
    version): its recipes then get no variants. Kept per document: a model's subgraphs share neighbours, and a
    space takes tens of milliseconds to build."""
    try:
        return RecipeSpace(lower(graph_from_json(ir_json)), backend)
    except EmbedError:
        return None


def random_recipes(space: RecipeSpace, n: int, *, seed: int) -> list[Recipe]:
    """``n`` distinct uniform random recipes of ``space``; the first m of n are the same for any n >= m."""
    return RandomSearch(space, budget=n, seed=seed + 1).ask(n)


def _fill(space: RecipeSpace, near: Sequence[Neighbour], taken: Collection[Recipe], wanted: int, *,
          seed: int, rank: Rank | None = None, pool: Sequence[Recipe] | None = None,
          explore: bool = True) -> dict[Recipe, str]:
    """Up to ``wanted`` recipes not in ``taken``, each with its origin, in order: the neighbours' variants over the
    knobs they were stored without, the vendor-ranked recipes, then (with ``explore``) uniform random ones, or with
    ``rank`` the best-ranked of ``pool`` (default: :data:`POOL` random recipes; ties keep the pool's order)."""
    sources: list[tuple[str, Callable[[], Iterable[Recipe]]]] = [
        ("variant", lambda: (v for n in near for v in space.variants(parse(n.recipe), n.newer_knobs))),
        ("vendor", space.vendor_ranked),
    ]
    if explore and rank is None:
        sources.append(("random", lambda: random_recipes(space, wanted + len(taken), seed=seed)))
    elif explore and rank is not None:
        sources.append(("model", lambda: _ranked(rank, random_recipes(space, POOL, seed=seed) if pool is None
                                                 else pool)))
    chosen: dict[Recipe, str] = {}
    for origin, candidates in sources:
        for recipe in candidates():
            if len(chosen) >= wanted:
                return chosen
            if recipe not in taken and recipe not in chosen:
                chosen[recipe] = origin
    return chosen


def _ranked(rank: Rank, pool: Sequence[Recipe]) -> list[Recipe]:
    candidates = list(dict.fromkeys(pool))
    scores = np.asarray(rank(candidates), dtype=float) if candidates else np.zeros(0)
    return [candidates[i] for i in np.argsort(-scores, kind="stable")]


def transfer_tune(task: Task, key: str, vector: np.ndarray, *, session: Session, index: VectorIndex, device_id: int,
                  measurer: Measurer, backend: str, k: int = 5, local_budget: int = 0, exclude: Collection[str] = (),
                  seed: int = 0, per_neighbour: int = 1, fill: bool = False, rank: Rank | None = None
                  ) -> TransferResult:
    """Transfer-tune one subgraph (``key``: its structural hash; ``vector``: its embedding for ``index``) from its
    ``k`` nearest neighbours, each giving its ``per_neighbour`` fastest recipes (:func:`transfer_from`)."""
    near = neighbours(session, index, vector, task=task, device_id=device_id, k=k, backend=backend, exclude=exclude,
                      per_neighbour=per_neighbour)
    return transfer_from(task, key, near, measurer=measurer, backend=backend, wanted=k * per_neighbour,
                         local_budget=local_budget, seed=seed, fill=fill, rank=rank)


def candidates(space: RecipeSpace, near: Sequence[Neighbour], *, wanted: int, seed: int = 0, fill: bool = False,
               rank: Rank | None = None, pool: Sequence[Recipe] | None = None, library: bool = False,
               explore: bool = True) -> dict[Recipe, str]:
    """What :func:`transfer_from` tries first, in order, each with its origin: the space's default recipe, its
    library alternatives (with ``library``), the nearest ``wanted`` distinct recipes of ``near``, and with ``fill``
    what :func:`_fill` makes up of the ``wanted`` the neighbours did not give."""
    default = space.default
    libraries = [r for r in space.alternatives if r != default] if library else []
    given = [r for r in dict.fromkeys(parse(n.recipe) for n in near) if r != default and r not in libraries][:wanted]
    filled = (_fill(space, near, {default, *libraries, *given}, wanted - len(given), seed=seed, rank=rank, pool=pool,
                    explore=explore) if fill else {})
    return ({default: "default"} | dict.fromkeys(libraries, "library") | dict.fromkeys(given, "neighbour")
            | filled)


def transfer_from(task: Task, key: str, near: Sequence[Neighbour], *, measurer: Measurer, backend: str, wanted: int,
                  local_budget: int = 0, seed: int = 0, fill: bool = False, rank: Rank | None = None,
                  pool: Sequence[Recipe] | None = None, library: bool = False, explore: bool = True
                  ) -> TransferResult:
    """Validate and time the default recipe and the neighbours' recipes (the nearest ``wanted`` distinct ones) on the
    task, keep the fastest; with ``fill``, the neighbours' variants over the knobs they were stored without, then
    vendor-ranked recipes, then (with ``explore``) random ones (with ``rank``: the best-ranked of ``pool``) make up the
    ``wanted`` candidates the neighbours did not give. With ``library``, the space's vendor alternatives (a library call
    in place of the generated kernel, e.g. cuDNN for a convolution) are candidates too, whatever the neighbours give
    (origin ``library``)."""
    space = RecipeSpace(task.program, backend)
    origins = candidates(space, near, wanted=wanted, seed=seed, fill=fill, rank=rank, pool=pool, library=library,
                         explore=explore)
    return measure_candidates(task, key, near, origins, measurer=measurer, space=space, local_budget=local_budget,
                              seed=seed)


def measure_candidates(task: Task, key: str, near: Sequence[Neighbour], origins: Mapping[Recipe, str], *,
                       measurer: Measurer, space: RecipeSpace, local_budget: int = 0, seed: int = 0) -> TransferResult:
    """:func:`transfer_from`'s measuring: the candidates ``origins`` names (with their origins, the space's default
    recipe among them, as :func:`candidates` makes them) validated and timed in order, then ``local_budget`` recipes
    of a local search around the fastest; the fastest kept."""
    default = space.default
    searcher = create("given_candidates", space, candidates=list(origins), local_budget=local_budget, seed=seed)
    search(searcher, lambda recipes: measurer.measure(task, key, recipes))
    base = next(m for r, m in searcher.history if r == default)
    tried = tuple(Tried(str(r), m, origins.get(r, "local")) for r, m in searcher.history)
    winner: tuple[Recipe, RunResult] = searcher.best or (default, base)
    return TransferResult(tuple(near), tried, str(winner[0]), winner[1].score, base.score)
