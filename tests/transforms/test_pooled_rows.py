"""A reduction over two inner dims (a global average pool) with its pointwise prologue runs as a row kernel over their
product (``transforms.views.kernel_program``, ``merge_inner_dims(reductions=True)``): one pass, the prologue's values
in registers, instead of a nest at a time through scratch."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from embed.builder import GraphBuilder
from embed.evaluate import evaluate
from embed.inputs import random_inputs
from embed.ir import Graph
from embed.lower import lower
from embed.partition import partition
from embed.subgraph import SubgraphKind
from tests.gpu import needs_gpu
from tests.transforms.test_views import threaded_host_source
from transforms.build import Source, build
from transforms.codegen import generate
from transforms.codegen.cuda_rows import has_row_groups
from transforms.problem import make_problem
from transforms.recipe import parse
from transforms.run import Trial, Worker, run
from transforms.space import RecipeSpace
from transforms.transformation import apply_recipe
from transforms.tune import evaluator, make_task
from transforms.views import merge_inner_dims

F32 = "float32"


def pooled(n: int = 2, c: int = 3, h: int = 5, w: int = 8) -> Graph:
    """batch norm -> relu6 -> global average pool, the activation kept too (MobileNet's squeeze-excite input)."""
    g = GraphBuilder("pooled")
    shape = (n, c, h, w)
    y = g.node("batch_norm", [g.input("x", shape, F32), *(g.param(p, (c,), F32) for p in ("m", "v", "g", "b"))],
               shape, F32, eps=1e-5)
    y = g.node("minimum", [g.node("maximum", [y, g.const(0.0, F32)], shape, F32), g.const(6.0, F32)], shape, F32,
               name="act")
    mean = g.node("reduce_mean", [y], (n, c, 1, 1), F32, axes=[2, 3], keepdim=True, name="pool")
    return g.build([y, mean])


def test_the_pool_and_its_prologue_are_one_row_group_over_h_times_w() -> None:
    graph = pooled()
    (subgraph,) = partition(graph)
    assert subgraph.kind == SubgraphKind.REDUCTION
    program = lower(graph)
    assert not has_row_groups(program)  # the mean reduces over two dims: no row kernel takes it as lowered
    task = make_task(subgraph)
    assert has_row_groups(task.program)
    mean = task.program.nests[-1]
    assert [d.extent for d in mean.parallel] == [2, 3] and [d.extent for d in mean.reduction] == [5 * 8]
    assert "row_mode" in {options[0].name for options in RecipeSpace(task.program, "cuda").dims}


def test_merged_reductions_compute_what_the_program_computes() -> None:
    graph = pooled()
    program = lower(graph)
    merged = merge_inner_dims(program, reductions=True)
    assert merged is not None
    inputs = random_inputs(graph, seed=7)
    want, got = evaluate(program, inputs), evaluate(merged, inputs)
    assert want.keys() == got.keys() and all(np.allclose(want[k], got[k], rtol=1e-12, atol=0) for k in want)


@pytest.fixture(scope="module")
def worker():
    with Worker() as w:
        yield w


ROW_RECIPES = ("fuse(all);reduce(block);row_depth(0);row_mode(registers);rows_per_block(1);threads(32);unroll(1);"
               "vectorize(4)",
               "fuse(all);reduce(block);row_depth(0);row_mode(online);rows_per_block(1);threads(32);unroll(1);"
               "vectorize(1)")


@pytest.mark.skipif(shutil.which("c++") is None, reason="no host C++ compiler")
def test_the_row_kernels_compute_the_pool_on_the_host(worker, tmp_path: Path) -> None:
    graph = pooled()
    (subgraph,) = partition(graph)
    task = make_task(subgraph)
    space = RecipeSpace(task.program, "cuda")
    kernels = [generate(apply_recipe(space.legal(parse(r)), task.program), "cuda") for r in ROW_RECIPES]
    assert [len(k.launches) for k in kernels] == [1, 1]
    assert kernels[1].launches[0].grid == (2 * 3, 1, 1)  # online: a block per row (registers: 4 lanes hold one)
    assert "uint4" in kernels[0].code  # the merged row's words are vector loads and stores
    options = ("-x", "c++", "-pthread", "-w", "-O1")
    built = build([Source(threaded_host_source(k.code, k.launches), "cpu", options=options) for k in kernels],
                  cache_dir=tmp_path)
    assert [b.error[:2000] for b in built if not b.ok] == []
    problem = make_problem(graph, lower(graph), seed=8)  # the reference: the unmerged program, in float64
    results = run([Trial(b, k.launches, problem) for b, k in zip(built, kernels, strict=True)], worker=worker,
                  repeats=1, warmup=0)
    assert [(r, x.error) for r, x in zip(ROW_RECIPES, results, strict=True) if not x.ok] == []


def test_the_cpu_kernel_computes_the_pool(worker, tmp_path: Path) -> None:
    (subgraph,) = partition(pooled())
    task = make_task(subgraph)
    (result,) = evaluator(task, backend="cpu", cache_dir=tmp_path, worker=worker, jobs=1, repeats=1)(
        [RecipeSpace(task.program, "cpu").default])
    assert result.ok, result.error


@needs_gpu
def test_the_mobilenet_pool_runs_as_rows_on_the_gpu(tmp_path: Path) -> None:
    """MobileNetV2's batch norm, relu6 and squeeze-excite mean at 56x56, 192 channels, batch 16: row kernels beside
    eager's time."""
    from transforms.tune import eager_seconds

    (subgraph,) = partition(pooled(16, 192, 56, 56))
    task = make_task(subgraph)
    space = RecipeSpace(task.program, "cuda")
    recipes = [space.default, *(space.legal(parse(r.replace("threads(32)", "threads(256)"))) for r in ROW_RECIPES)]
    with Worker() as w:
        results = evaluator(task, backend="cuda", cache_dir=tmp_path, worker=w, jobs=4, repeats=30)(recipes)
    print("\n" + ", ".join(f"{r}: {x.median_s * 1e6:.1f} us" if x.ok else f"{r}: {x.error_kind}"
                           for r, x in zip(recipes, results, strict=True))
          + f"; eager {eager_seconds(task, backend='cuda') * 1e6:.1f} us")
    assert [(str(r), x.error) for r, x in zip(recipes, results, strict=True) if not x.ok] == []
