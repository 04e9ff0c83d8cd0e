"""The crawler's tuning step on cuda recipe spaces (no GPU: the synthetic measurer times nothing)."""

import threading

from embed import zoo
from embed.partition import partition
from embed.subgraph import Subgraph
from service.crawl import cross_recipes, tune_one
from tests.service.conftest import synthetic_measurer
from transforms.search.strategy import Measured
from transforms.space import RecipeSpace
from transforms.tune import make_task


def _contractions(model: str) -> list[Subgraph]:
    return [s for s in partition(zoo.load(model)) if s.tunable and s.kind.value == "contraction"]


def test_tune_one_stops_when_the_space_is_used_up() -> None:
    subgraph = _contractions("lm_head-h64-v256-t32")[0]
    task = make_task(subgraph)
    space = RecipeSpace(task.program, "cuda")
    history: list[Measured] = []
    worker = threading.Thread(daemon=True, target=lambda: history.extend(tune_one(
        task, subgraph.structural_hash, synthetic_measurer(), backend="cuda", budget=space.size() + 20)))
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "tune_one did not return once the whole space was measured"
    assert {r for r, _ in history} == set(space.enumerate())  # the default, told first, may be proposed again


def test_cross_recipes_leave_out_recipes_with_no_step_that_applies() -> None:
    gemm = make_task(_contractions("lm_head-h64-v256-t32")[0]).program
    rows = make_task(next(s for s in partition(zoo.load("bert_encoder-h128-s16-b1"))
                          if s.tunable and s.kind.value == "reduction")).program  # a row kernel: no gemm step
    gemm_recipe = str(next(RecipeSpace(gemm, "cuda").enumerate()))
    rows_recipe = str(next(RecipeSpace(rows, "cuda").enumerate()))
    assert cross_recipes(rows, "cuda", {"a": gemm_recipe, "b": rows_recipe}) == {"b": rows_recipe}
    assert set(cross_recipes(gemm, "cuda", {"a": gemm_recipe})) == {"a"}
