"""GPU tests of the vendor convolution (``conv(cudnn,benchmark)``, ``conv(cudnn,benchmark,tf32)``, and ``conv(torch)``
and ``conv(cudnn,default)``, which apply but are not offered): each validates through the cuda worker (CuPy buffers seen
by PyTorch, CUDA-graph timing) at the ConvNeXt 7x7 depthwise and ResNet conv+bn+add+relu sizes of the GPU bench, runs in
a cuda plan (uncaptured and captured as a CUDA graph), and prints its time beside the generated direct convolution's and
eager's (run with ``-s`` to see them). The cuda sources also compile with nvcc without a GPU (the last test)."""

from pathlib import Path

import numpy as np
import pytest
import torch

from embed import zoo
from embed.eager import run_eager
from embed.inputs import random_inputs
from embed.lower import lower
from embed.partition import partition
from tests.gpu import needs_gpu
from tests.transforms.test_vendor import conv_block
from transforms.build import Source, build
from transforms.codegen import generate
from transforms.plan import Plan, Step, Target, kernel_step
from transforms.plan_runtime import PlanModule
from transforms.recipe import parse
from transforms.run import Launch, Worker
from transforms.space import RecipeSpace
from transforms.transformation import apply_recipe
from transforms.tune import eager_seconds, evaluator, make_task

OFFERED = ("conv(cudnn,benchmark,tf32)",)  # the search in eager's precision (TF32, PyTorch's default)
CONVS = ("conv(cudnn,benchmark)", *OFFERED, "conv(torch)")  # the others apply on cuda, offered elsewhere
MODELS = ("convnext_block-c96-i56-b8", "resnet_basic-c64-i56-b8")


def conv_subgraphs(model: str) -> list:
    return [s for s in partition(zoo.load(model)) if s.ops[0] == "conv2d"]


@needs_gpu
@pytest.mark.parametrize("model", MODELS)
def test_cuda_vendor_convolutions_validate_and_are_timed(model: str, tmp_path: Path) -> None:
    with Worker() as worker:
        for s in conv_subgraphs(model):
            task = make_task(s)
            space = RecipeSpace(task.program, "cuda")
            vendor = [parse(r) for r in CONVS]
            assert [r for r in space.vendor_ranked() if r in vendor] == [parse(r) for r in OFFERED]
            evaluate = evaluator(task, backend="cuda", cache_dir=tmp_path, worker=worker, jobs=4, repeats=30)
            results = evaluate([space.default, *vendor])
            eager = eager_seconds(task, backend="cuda")
            line = ", ".join(f"{r}: {x.median_s * 1e6:.1f} us" if x.ok else f"{r}: {x.error_kind}"
                             for r, x in zip(["generated", *CONVS], results, strict=True))
            print(f"\n{model} {'+'.join(s.ops)}: {line}, eager {eager * 1e6:.1f} us")
            for recipe, result in zip(CONVS, results[1:], strict=True):
                assert result.ok, (recipe, result.error_kind, result.error)


@needs_gpu
@pytest.mark.parametrize("recipe", (*CONVS, "conv(cudnn,default)"))
def test_a_cuda_plan_with_a_vendor_convolution_computes_what_eager_computes(recipe: str, tmp_path: Path) -> None:
    graph = conv_block()
    steps = [kernel_step(s, recipe, "cuda") if s.ops[0] == "conv2d" else Step(s.structural_hash, "eager")
             for s in partition(graph)]
    plan = Plan(graph, tuple(steps), Target("cuda", "cuda", "cuda", "", "test"))
    inputs = random_inputs(graph, seed=3)
    tensors = {n: torch.as_tensor(v) for n, v in inputs.items()}
    expected = run_eager(graph, tensors, compute_dtype=torch.float64)["out"]
    params = {n: tensors[n] for n in graph.inputs if n not in ("x", "r")}
    x, r = tensors["x"].cuda(), tensors["r"].cuda()
    for cuda_graph in (False, True):
        module = PlanModule(plan, params, cache_dir=tmp_path, cuda_graph=cuda_graph)
        for _ in range(3):  # the captured graph replays
            torch.cuda._sleep(20_000_000)  # the input is written behind a busy GPU: the conv must wait for it
            got = module(x * 1, r).double().cpu()
            scale, tolerance = float(expected.abs().max()), 1e-2 if "tf32" in recipe else 1e-4
            np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=tolerance, atol=tolerance * scale)


def test_the_cuda_epilogue_kernels_compile(tmp_path: Path) -> None:
    """nvcc compiles what the cuda vendor steps generate (no GPU needed: the epilogue is plain CUDA)."""
    from transforms.compilers import cuda

    if not cuda.available():
        pytest.skip("no CUDA compiler here (NVRTC or nvcc)")
    sources = []
    for s in conv_subgraphs("resnet_basic-c64-i7-b1") + [s for s in partition(conv_block()) if s.ops[0] == "conv2d"]:
        kernel = generate(apply_recipe(parse("conv(cudnn,benchmark)"), lower(s.graph)), "cuda")
        assert kernel.launches[0].library == "cudnn_conv"
        sources.append(Source(kernel.code, "cuda", arch="compute_90"))
    results = build(sources, cache_dir=tmp_path, jobs=2)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:1]


@needs_gpu
def test_the_cudnn_benchmark_search_is_limited_to_the_heuristics_first_plans(monkeypatch) -> None:
    import cupy

    from transforms import vendor_torch

    seen = []
    monkeypatch.setattr(vendor_torch, "_conv", lambda launch, cudnn: lambda tensors: seen.append(
        (torch.backends.cudnn.benchmark_limit, torch.backends.cudnn.enabled)))
    (conv,) = conv_subgraphs(MODELS[0])[:1]
    launch = next(Launch.from_json(data) for data in kernel_step(conv, "conv(cudnn,benchmark)", "cuda").launches
                  if data["library"] == "cudnn_conv")
    call = vendor_torch.cudnn_conv(launch)
    call((1, 1, 1), (1, 1, 1), [cupy.zeros(b.shape, cupy.float32) for b in launch.buffers])
    assert seen == [(vendor_torch.BENCHMARK_LIMIT, True)] and torch.backends.cudnn.benchmark_limit == 10
