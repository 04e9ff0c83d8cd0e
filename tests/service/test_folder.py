"""How optimize decides a fold (``service.optimize._Folder``), on planted times: a layout view that a kernel loads is
charged the copy that kernel's contiguous read makes; a layout step the kernel stores through is not."""

from collections.abc import Sequence
from types import SimpleNamespace

import pytest
import torch

from embed.importers import import_module
from embed.partition import partition_nodes
from service.optimize import _Folder
from service.optimize_report import SubgraphReport
from tests.service.test_optimize import TransposeBetweenKernels
from transforms.plan import Step, kernel_step
from transforms.recipe import Recipe
from transforms.results import RunResult
from transforms.space import default_recipe
from transforms.tune import Task, make_task

KERNEL_S, VIEW_S = 9e-6, 1e-6  # each kernel step, and the transpose as eager runs it (a view)


class PlantedTimes:
    """A measurer whose folded kernels take ``folded_s`` and whose copy kernels take ``copy_s``."""

    def __init__(self, folded_s: float, copy_s: float) -> None:
        self.folded_s, self.copy_s = folded_s, copy_s
        self.table = SimpleNamespace(results={})
        self.measured: list[str] = []

    def measure(self, task: Task, key: str, recipes: Sequence[Recipe]) -> list[RunResult]:
        self.measured.append(task.kind)
        seconds = self.copy_s if task.kind == "layout" else self.folded_s
        return [RunResult(ok=True, median_s=seconds, min_s=seconds, repeats=3) for _ in recipes]


def fold(folded_s: float, copy_s: float, *, view: bool) -> tuple[list[Step], PlantedTimes]:
    graph = import_module(TransposeBetweenKernels().eval(), (torch.randn(16, 32),))
    parts = partition_nodes(graph)
    assert [s.kind.value for s, _ in parts] == ["contraction", "layout", "reduction"]
    chosen, steps = {}, []
    for sub, _ in parts:
        row = SubgraphReport("", sub.kind.value, sub.structural_hash, list(sub.ops), 1, "transfer")
        if sub.kind.value == "layout":
            row.source, row.eager_s = ("bound" if view else "transfer"), VIEW_S
            steps.append(Step(sub.structural_hash, "eager"))
        else:
            recipe = str(default_recipe(make_task(sub).program, "cpu"))
            row.choice, row.recipe, row.kernel_s = "kernel", recipe, KERNEL_S
            steps.append(kernel_step(sub, recipe, "cpu"))
        chosen[sub.structural_hash] = row
    times = PlantedTimes(folded_s, copy_s)
    store = SimpleNamespace(results=lambda subgraph: {})
    folded = _Folder(graph, parts, chosen, "cpu", store, times, seed=0, margin=0.05).fold(steps)
    return folded, times


def test_a_view_a_kernel_loads_is_charged_its_copy_so_the_fold_that_saves_it_is_kept() -> None:
    # 12 us folded: slower than 9 + 1 us apart, faster than 9 us + the 5 us copy the softmax's read makes
    steps, times = fold(12e-6, 5e-6, view=True)
    assert [s.impl for s in steps] == ["kernel", "folded", "kernel"]
    assert steps[2].folded == (1,)  # into the softmax's loads; the GEMM's store makes no copy to save
    assert times.measured.count("layout") == 1  # the copy, measured once


@pytest.mark.parametrize("view", [True, False])
def test_a_fold_slower_than_the_steps_apart_is_not_kept(view: bool) -> None:
    # the copy is cheap (or the layout step was timed as what it costs: no view): 12 us folded loses either way
    steps, _ = fold(12e-6, 0.5e-6 if view else 5e-6, view=view)
    assert [s.impl for s in steps] == ["kernel", "eager", "kernel"]
