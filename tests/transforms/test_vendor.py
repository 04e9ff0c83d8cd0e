"""Vendor paths as recipes: a convolution run by the library through PyTorch (``conv(torch)`` on cpu; cuDNN on
cuda: tests/transforms/test_vendor_gpu.py) and the cpu BLAS GEMM (``gemm(blas)``), each followed by the generated
epilogue kernel. The convolution stands beside the generated kernels' space, is offered by ``vendor_ranked``
(transfer fills with it) and measured by ``tune`` (``gemm(blas)`` joins the space once the recorded cpu replay is
re-made: ``transforms.steps.gemm``); both validate against the float64 reference through the worker, run in a cpu plan
and are regenerated and checked by ``verify`` like any kernel."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from embed.builder import GraphBuilder
from embed.eager import run_eager
from embed.inputs import random_inputs
from embed.ir import Graph
from embed.lower import lower
from embed.partition import partition
from transforms.adapt import adapt
from transforms.convolution import match_convolution
from transforms.plan import Plan, PlanError, Step, Target, kernel_step, verify
from transforms.plan_runtime import PlanModule
from transforms.recipe import parse
from transforms.run import Launch, Worker
from transforms.schedule import ScheduleError
from transforms.space import RecipeSpace
from transforms.tune import evaluator, make_task, tune

F32 = "float32"


def conv_block(*, groups: int = 2, stride: int = 2, dilation: int = 2, padding: int = 3) -> Graph:
    """A grouped, strided, dilated, padded conv (no bias) -> batch-norm -> + residual -> relu, then a depthwise 7x7
    conv with bias (ConvNeXt's), then a linear layer with bias and gelu over the flattened pixels."""
    g = GraphBuilder("conv_block")
    x = g.input("x", (2, 8, 13, 11), F32)
    size = [(n + 2 * padding - dilation * 2 - 1) // stride + 1 for n in (13, 11)]
    y = g.node("conv2d", [x, g.param("w", (8, 8 // groups, 3, 3), F32)], (2, 8, *size), F32,
               stride=[stride, stride], padding=[padding, padding], dilation=[dilation, dilation], groups=groups)
    stats = [g.param(n, (8,), F32) for n in ("mean", "var", "gamma", "beta")]
    y = g.node("batch_norm", [y, *stats], (2, 8, *size), F32, eps=1e-5)
    r = g.input("r", (2, 8, *size), F32)
    y = g.node("relu", [g.node("add", [y, r], (2, 8, *size), F32)], (2, 8, *size), F32)
    d = g.node("conv2d", [y, g.param("dw", (8, 1, 7, 7), F32), g.param("db", (8,), F32)], (2, 8, *size), F32,
               stride=[1, 1], padding=[3, 3], dilation=[1, 1], groups=8)
    flat = g.node("reshape", [d], (2 * 8, size[0] * size[1]), F32, shape=[2 * 8, size[0] * size[1]])
    h = g.node("matmul", [flat, g.param("fc", (size[0] * size[1], 24), F32)], (16, 24), F32)
    out = g.node("gelu", [g.node("add", [h, g.param("fb", (24,), F32)], (16, 24), F32)], (16, 24), F32, name="out")
    return g.build([out])


def subgraphs(graph: Graph, op: str) -> list:
    return [s for s in partition(graph) if s.ops[0] == op]


def test_the_vendor_convolution_is_a_candidate_and_validates(tmp_path: Path) -> None:
    graph = conv_block()
    convs = subgraphs(graph, "conv2d")
    assert [s.ops[0] for s in convs] == ["conv2d", "conv2d"] and convs[0].ops == ["conv2d", "batch_norm", "add", "relu"]
    found = [match_convolution(lower(s.graph)) for s in convs]
    assert [(c.stride, c.padding, c.dilation, c.groups) for c in found if c] == [
        ((2, 2), (3, 3), (2, 2), 2), ((1, 1), (3, 3), (1, 1), 8)]
    with Worker() as worker:
        for s in convs:
            task = make_task(s)
            space = RecipeSpace(task.program, "cpu")
            conv = parse("conv(torch)")
            # the library's call is a candidate beside the generated direct convolution, which stays the default
            assert conv in space.alternatives and conv in space.vendor_ranked()
            assert conv in set(space.enumerate()) and space.size() > 1000 and "conv" not in str(space.default)
            assert space.legal(conv) == conv and space.legal(parse("fuse(all);conv(torch)")) == conv
            assert space.unset_knobs(conv) == set()
            evaluate = evaluator(task, backend="cpu", cache_dir=tmp_path, worker=worker, jobs=1, repeats=3)
            (result,) = evaluate([conv])
            assert result.ok, result.error  # checked against the float64 reference, outputs poisoned first
            assert result.max_rel_err is not None and result.max_rel_err < 1e-4


def test_gemm_blas_validates_with_its_epilogue(tmp_path: Path) -> None:
    (linear,) = subgraphs(conv_block(), "matmul")
    task = make_task(linear)
    blas = parse("gemm(blas)")
    assert RecipeSpace(task.program, "cpu").legal(blas) != blas  # not in the cpu space yet: see Gemm.vendor_ranked
    with Worker() as worker:
        evaluate = evaluator(task, backend="cpu", cache_dir=tmp_path, worker=worker, jobs=1, repeats=3)
        (result,) = evaluate([blas])
    assert result.ok, result.error


def test_tune_measures_the_vendor_recipes_after_the_default(tmp_path: Path) -> None:
    graph = conv_block()
    convs = subgraphs(graph, "conv2d")[1:]  # the depthwise conv
    results = tune(convs, strategy="random", backend="cpu", budget=1, cache_dir=tmp_path, repeats=2)
    (result,) = results
    assert result.evaluated == 3  # the default, conv(torch), one random recipe
    assert result.best_recipe is not None and result.failed == 0


def test_tf32_convolution_is_offered_and_validated_as_eager_convolves() -> None:
    (conv,) = subgraphs(conv_block(), "conv2d")[:1]
    program = make_task(conv).program
    tf32, plain = parse("conv(cudnn,benchmark,tf32)"), parse("conv(cudnn,benchmark)")
    assert torch.backends.cudnn.allow_tf32  # PyTorch's default: eager convolves float32 in TF32 on a GPU
    assert tf32 in RecipeSpace(program, "cuda").alternatives
    launches = {r: kernel_step(conv, str(r), "cuda").launches for r in (tf32, plain)}
    scalars = {r: {a["name"]: a["value"] for a in ls[0]["args"] if a["type"] == "Scalar"} for r, ls in launches.items()}
    assert scalars[tf32]["tf32"] == 1 and scalars[plain]["tf32"] == 0 and scalars[tf32]["benchmark"] == 1
    task = make_task(conv)
    tolerance = {r: task.problem.tolerances([Launch.from_json(x) for x in launches[r]]) for r in (tf32, plain)}
    (out,) = tolerance[plain]
    assert tolerance[tf32][out] == pytest.approx(100 * tolerance[plain][out])  # float16's 1e-2 for float32's 1e-4
    assert plain not in RecipeSpace(program, "cuda").alternatives  # cuDNN's search in eager's precision only
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # a user who turned TF32 off
        assert tf32 not in RecipeSpace(program, "cuda").alternatives
        assert plain in RecipeSpace(program, "cuda").alternatives
        with pytest.raises(ScheduleError, match="TF32 is off"):
            kernel_step(conv, str(tf32), "cuda")


def test_no_vendor_convolution_where_the_library_cannot_take_it() -> None:
    g = GraphBuilder("pool")
    x = g.input("x", (1, 4, 8, 8), F32)
    pooled = g.node("max_pool2d", [x], (1, 4, 4, 4), F32, name="out", kernel=[2, 2], stride=[2, 2], padding=[0, 0])
    program = lower(g.build([pooled]))
    assert match_convolution(program) is None
    assert RecipeSpace(program, "cpu").alternatives == ()
    # float16: the vendor paths keep the raw sum in the compute type (left for later)
    h = GraphBuilder("half")
    y = h.node("conv2d", [h.input("x", (1, 4, 8, 8), "float16"), h.param("w", (4, 4, 3, 3), "float16")],
               (1, 4, 6, 6), "float16", name="out", stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1)
    assert match_convolution(lower(h.build([y]))) is None


def vendor_plan(graph: Graph) -> Plan:
    """Every conv2d subgraph as conv(torch), every matmul one as gemm(blas), the rest eager."""
    steps = []
    for s in partition(graph):
        recipe = {"conv2d": "conv(torch)", "matmul": "gemm(blas)"}.get(s.ops[0])
        steps.append(kernel_step(s, recipe, "cpu") if recipe else Step(s.structural_hash, "eager"))
    return Plan(graph, tuple(steps), Target("cpu", "cpu", "cpu", "", "test"))


def test_a_cpu_plan_with_vendor_steps_computes_what_eager_computes(tmp_path: Path) -> None:
    graph = conv_block()
    plan = vendor_plan(graph)
    assert plan.kernels == 3
    inputs = random_inputs(graph, seed=3)
    tensors = {n: torch.as_tensor(v) for n, v in inputs.items()}
    expected = run_eager(graph, tensors, compute_dtype=torch.float64)["out"]
    params = {n: tensors[n] for n in graph.inputs if n not in ("x", "r")}
    module = PlanModule(plan, params, cache_dir=tmp_path)
    got = module(tensors["x"], tensors["r"])
    scale = float(expected.abs().max())
    np.testing.assert_allclose(got.double().numpy(), expected.numpy(), rtol=1e-4, atol=1e-4 * scale)


def test_verify_regenerates_the_vendor_step_and_refuses_a_tampered_one() -> None:
    plan = vendor_plan(conv_block())
    verify(plan)
    k = next(i for i, s in enumerate(plan.steps) if s.recipe == "conv(torch)")
    launches = json.loads(json.dumps(plan.steps[k].launches))
    groups = next(a for a in launches[0]["args"] if a["name"] == "groups")
    groups["value"] = 1  # a vendor call with other parameters than its recipe gives
    steps = list(plan.steps)
    steps[k] = replace(plan.steps[k], launches=tuple(launches))
    with pytest.raises(PlanError, match="differs from what its recipe generates"):
        verify(replace(plan, steps=tuple(steps)))
    steps[k] = replace(plan.steps[k], recipe="conv(cudnn,benchmark)")  # cuDNN is no cpu library
    with pytest.raises(PlanError, match="does not apply"):
        verify(replace(plan, steps=tuple(steps)))


def test_a_cpu_library_conv_amplified_by_batch_norm_validates(tmp_path: Path) -> None:
    """The tolerance raised to what plain float32 errs reaches the worker of a cpu trial, whose problem is saved."""
    from tests.transforms.test_problem import conv_bn_relu6

    (conv,) = subgraphs(conv_bn_relu6(), "conv2d")
    task = make_task(conv, seed=3)
    with Worker() as worker:
        (result,) = evaluator(task, backend="cpu", cache_dir=tmp_path, worker=worker, jobs=1, repeats=2)(
            [parse("conv(torch)")])
    assert result.ok, result.error
    assert result.max_rel_err > 1.5e-4  # past float32's tolerance widened for 32 terms, 1.41e-4


def test_cudnn_heuristic_convolution_applies_but_is_not_offered() -> None:
    """PyTorch keeps one cuDNN plan per shape in a process, whichever mode made it first: after the benchmark search a
    ``conv(cudnn,default)`` candidate would time the searched plan again. It still applies (older plans hold it)."""
    (conv,) = subgraphs(conv_block(), "conv2d")[:1]
    space = RecipeSpace(make_task(conv).program, "cuda")
    heuristic = parse("conv(cudnn,default)")
    offered = [str(r) for r in space.vendor_ranked() if str(r).startswith("conv(")]
    assert offered == ["conv(cudnn,benchmark,tf32)"]  # the search in eager's precision; conv(torch): cpu's only
    assert heuristic not in space.alternatives and parse("conv(torch)") not in space.alternatives
    assert kernel_step(conv, "conv(torch)", "cuda").launches  # still applies: plans and databases hold it
    launch = kernel_step(conv, "conv(cudnn,default)", "cuda").launches[0]
    assert {a["name"]: a["value"] for a in launch["args"] if a["type"] == "Scalar"}["benchmark"] == 0
    with pytest.raises(ScheduleError, match="use one of .*conv\\(cudnn,default\\)"):
        kernel_step(conv, "conv(cudnn,fastest)", "cuda")
    # a neighbour that stored it lends cuDNN's searched plan, the one a run after the search gets anyway
    assert adapt(heuristic, make_task(conv).program, "cuda")[0] == parse("conv(cudnn,benchmark,tf32)")
