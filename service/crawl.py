"""The crawler's tuning step: tune subgraphs, then cross-apply the best recipes of same-kind subgraphs to each
(the cross table the learned encoder trains on), and store everything with a baseline profile per subgraph.

    report = crawl(database, subgraphs, measurer, backend="cpu", budget=32)
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from db.session import Database
from embed.features import static_features
from embed.loopnest import LoopProgram
from embed.profile import Baseline, DeviceSpec, profiled_features
from embed.subgraph import Subgraph
from service.measure import Measurer
from service.store import add_measurements, add_profiles, add_subgraphs, register_device
from transforms.adapt import adapt
from transforms.recipe import Recipe, parse
from transforms.search import create
from transforms.search.strategy import Measured, search
from transforms.space import RecipeSpace, default_recipe
from transforms.tune import Task, make_task


def baseline(task: Task, key: str, measurer: Measurer, backend: str) -> Baseline:
    """The default recipe's and eager PyTorch's times for one subgraph."""
    (result,) = measurer.measure(task, key, [default_recipe(task.program, backend)])
    return Baseline(result.score, measurer.eager(task, key))


def profile_vector(task: Task, subgraph: Subgraph, base: Baseline, device: DeviceSpec) -> np.ndarray:
    static = static_features(task.program, family_hash=subgraph.family_hash)
    return profiled_features(static, base, device).as_array()


def tune_one(task: Task, key: str, measurer: Measurer, *, backend: str, strategy: str = "evolutionary",
             budget: int = 32, seed: int = 0, batch: int = 8) -> list[Measured]:
    """The default recipe, then ``budget`` recipes proposed by ``strategy`` (fewer when the space runs out);
    every measurement, in order."""
    space = RecipeSpace(task.program, backend)
    default = default_recipe(task.program, backend)
    searcher = create(strategy, space, budget=budget, seed=seed)
    searcher.tell(list(zip([default], measurer.measure(task, key, [default]), strict=True)))
    search(searcher, lambda recipes: measurer.measure(task, key, recipes), batch=batch)
    return searcher.history


def best_of(history: Sequence[Measured]) -> tuple[Recipe, float] | None:
    ok = [(recipe, result.score) for recipe, result in history if result.ok]
    return min(ok, key=lambda m: m[1]) if ok else None


def cross_recipes(program: LoopProgram, backend: str, bests: Mapping[str, str]) -> dict[str, str]:
    """Each source's best recipe (canonical strings by source key) adapted to ``program``; a source none of whose
    steps applies here (a cuda ``gemm`` recipe on a contraction the gemm step cannot take) is left out."""
    adapted = {source: str(adapt(parse(recipe), program, backend)[0]) for source, recipe in bests.items()}
    return {source: recipe for source, recipe in adapted.items() if recipe}


@dataclass(frozen=True)
class CrawlReport:
    subgraphs: int
    measurements: int
    cross_applications: int
    best: dict[str, tuple[str, float]]  # structural hash -> (best recipe, seconds)


def crawl(database: Database, subgraphs: Sequence[Subgraph], measurer: Measurer, *, backend: str,
          strategy: str = "evolutionary", budget: int = 32, seed: int = 0, cross: bool = True) -> CrawlReport:
    """Tune each distinct tunable subgraph, cross-apply same-kind best recipes, store it all (one transaction
    per subgraph), with the baseline profile of each subgraph."""
    device, toolchain = measurer.table.device, measurer.table.toolchain
    unique = {s.structural_hash: s for s in subgraphs if s.tunable}
    tasks = {h: make_task(s, seed=seed) for h, s in unique.items()}
    with database.scope() as session:
        device_id = register_device(session, device)
        ids = add_subgraphs(session, list(unique.values()))
    best: dict[str, tuple[str, float]] = {}
    stored = 0
    for key, task in tasks.items():
        base = baseline(task, key, measurer, backend)
        history = tune_one(task, key, measurer, backend=backend, strategy=strategy, budget=budget, seed=seed)
        found = best_of(history)
        if found is not None:
            best[key] = (str(found[0]), found[1])
        with database.scope() as session:
            stored += add_measurements(session, device, toolchain, key, [(str(r), m) for r, m in history])
            add_profiles(session, device_id, {ids[key]: profile_vector(task, unique[key], base, device)})
    applied = 0
    if cross:
        for key, task in tasks.items():
            sources = {h: r for h, (r, _) in best.items() if h != key and unique[h].kind == unique[key].kind}
            recipes = sorted(set(cross_recipes(task.program, backend, sources).values()))
            results = measurer.measure(task, key, [parse(r) for r in recipes])
            applied += len(recipes)
            with database.scope() as session:
                stored += add_measurements(session, device, toolchain, key, list(zip(recipes, results, strict=True)))
    return CrawlReport(len(unique), stored, applied, best)
