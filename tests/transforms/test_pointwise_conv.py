"""A 1x1 convolution is a batched GEMM of its weights and each image's pixels (``transforms.views.merge_inner_dims``,
``transforms.contraction``): recognised with the strides its shapes give, computed right by the generated and vendor
GEMM paths with its batch-norm and residual epilogue, and left alone where a stride or padding keeps it no GEMM."""

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
from tests.gpu import needs_gpu
from tests.transforms.test_views import threaded_host_source
from transforms.build import Source, build
from transforms.codegen import generate
from transforms.contraction import Operand, match_contraction
from transforms.problem import make_problem
from transforms.recipe import parse
from transforms.run import Trial, Worker, run
from transforms.space import RecipeSpace
from transforms.transformation import apply_recipe
from transforms.tune import evaluator, make_task
from transforms.views import merge_inner_dims

F32 = "float32"
N, C, H, W, OUT = 2, 12, 5, 7, 4


def pointwise_conv(*, stride: tuple[int, int] = (1, 1), padding: int = 0, kernel: int = 1) -> Graph:
    """conv2d [N, C, H, W] -> [N, OUT, ..] -> batch-norm -> + residual -> relu: a MobileNet projection's shape."""
    g = GraphBuilder("pointwise")
    x = g.input("x", (N, C, H, W), F32)
    oh, ow = ((n + 2 * padding - kernel) // s + 1 for n, s in zip((H, W), stride, strict=True))
    shape = (N, OUT, oh, ow)
    y = g.node("conv2d", [x, g.param("w", (OUT, C, kernel, kernel), F32)], shape, F32, stride=list(stride),
               padding=[padding] * 2, dilation=[1, 1], groups=1)
    stats = [g.param(n, (OUT,), F32) for n in ("mean", "var", "gamma", "beta")]
    y = g.node("add", [g.node("batch_norm", [y, *stats], shape, F32, eps=1e-5), g.input("r", shape, F32)], shape, F32)
    return g.build([g.node("relu", [y], shape, F32, name="out")])


def test_a_1x1_convolution_is_a_batched_gemm_of_its_weights_and_pixels() -> None:
    c = match_contraction(lower(pointwise_conv()))
    assert c is not None and (c.batch, c.m, c.n, c.k) == ((N,), OUT, H * W, C)
    # out[n] = w[OUT, C] @ x[n][C, H * W]: the weight is the same for every image, x's pixels are contiguous
    assert c.a == Operand("w", c.a.dtype, (0,), C, 1)
    assert c.b == Operand("x", c.b.dtype, (C * H * W,), 1, H * W)
    assert [n.op for n in c.program.nests] == ["conv2d", "batch_norm", "add", "relu"]
    space = RecipeSpace(lower(pointwise_conv()), "cuda")
    assert parse("gemm(cublaslt,0)") in space.vendor_ranked()
    assert parse("conv(cudnn,benchmark,tf32)") in space.alternatives


# a stride along h alone leaves rows of W pixels apart by 2 * W: unit-stride within, no single stride across
@pytest.mark.parametrize("conv", [{"stride": (2, 2)}, {"stride": (2, 1)}, {"padding": 1}, {"kernel": 3, "padding": 1}])
def test_strided_padded_or_wider_convolutions_are_no_gemm(conv: dict[str, int]) -> None:
    assert match_contraction(lower(pointwise_conv(**conv))) is None


def test_merged_inner_dims_compute_what_the_program_computes() -> None:
    graph = pointwise_conv()
    program = lower(graph)
    merged = merge_inner_dims(program)
    assert merged is not None
    assert [[d.extent for d in n.parallel] for n in merged.nests] == [[N, OUT, H * W]] * 4
    inputs = random_inputs(graph, seed=5)
    want, got = evaluate(program, inputs), evaluate(merged, inputs)
    assert want.keys() == got.keys() and all(np.array_equal(want[k], got[k]) for k in want)


@pytest.fixture(scope="module")
def worker():
    with Worker() as w:
        yield w


CUDA_TILES = ("gemm(simt,32,32,8,1,1,1)", "gemm(simt,32,64,2,2,1,4,3)")  # one kernel; split-K (a sum kernel after)


@pytest.mark.skipif(shutil.which("c++") is None, reason="no host C++ compiler")
def test_cuda_gemm_kernels_run_a_1x1_convolution_on_the_host(worker, tmp_path: Path) -> None:
    graph = pointwise_conv()
    program = lower(graph)
    kernels = [generate(apply_recipe(parse(recipe), program), "cuda") for recipe in CUDA_TILES]
    assert [len(k.launches) for k in kernels] == [1, 2]
    options = ("-x", "c++", "-pthread", "-w", "-O1")
    built = build([Source(threaded_host_source(k.code, k.launches), "cpu", options=options) for k in kernels],
                  cache_dir=tmp_path)
    assert [b.error[:2000] for b in built if not b.ok] == []
    problem = make_problem(graph, program, seed=6)  # the reference: the unmerged program, in float64
    results = run([Trial(b, k.launches, problem) for b, k in zip(built, kernels, strict=True)], worker=worker,
                  repeats=1, warmup=0)
    assert [(recipe, r.error) for recipe, r in zip(CUDA_TILES, results, strict=True) if not r.ok] == []


def test_the_cpu_blas_gemm_runs_a_1x1_convolution(worker, tmp_path: Path) -> None:
    (subgraph,) = partition(pointwise_conv())
    evaluate_ = evaluator(make_task(subgraph), backend="cpu", cache_dir=tmp_path, worker=worker, jobs=1, repeats=3)
    (result,) = evaluate_([parse("gemm(blas)")])
    assert result.ok, result.error


@needs_gpu
def test_cuda_gemms_run_a_mobilenet_expansion(tmp_path: Path) -> None:
    """MobileNetV2's 1x1 expansion at 56x56 (32 -> 192 channels, batch 16) with its batch norm and relu, on every
    GEMM path beside cuDNN's convolution."""
    g = GraphBuilder("expand")
    y = g.node("conv2d", [g.input("x", (16, 32, 56, 56), F32), g.param("w", (192, 32, 1, 1), F32)],
               (16, 192, 56, 56), F32, stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1)
    y = g.node("batch_norm", [y, *(g.param(n, (192,), F32) for n in ("mean", "var", "gamma", "beta"))],
               (16, 192, 56, 56), F32, eps=1e-5)
    (subgraph,) = partition(g.build([g.node("relu", [y], (16, 192, 56, 56), F32, name="out")]))
    task = make_task(subgraph)
    space = RecipeSpace(task.program, "cuda")
    recipes = [space.default, parse("gemm(simt,64,64,16,4,1,8)"), parse("gemm(cublas)"), parse("conv(cudnn,benchmark)"),
               parse("conv(cudnn,benchmark,tf32)")]
    with Worker() as w:
        results = evaluator(task, backend="cuda", cache_dir=tmp_path, worker=w, jobs=4, repeats=30)(recipes)
    print("\n" + ", ".join(f"{r}: {x.median_s * 1e6:.1f} us" if x.ok else f"{r}: {x.error_kind}"
                           for r, x in zip(recipes, results, strict=True)))
    assert [(str(r), x.error) for r, x in zip(recipes, results, strict=True) if not x.ok] == []
