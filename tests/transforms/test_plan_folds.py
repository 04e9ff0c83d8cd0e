"""Layout steps of a plan that cost nothing: a transpose between two kernels folded into the store of the kernel
before it or the loads of the kernel after it (one kernel step runs both; the layout step runs nothing), and a layout
step left eager that is a view, made contiguous before a kernel reads it. Plans are built by hand here (no timing),
so each fold is checked against the float64 eager reference whatever a machine measures; the optimize pipeline that
chooses folds is tested in tests/service/test_optimize.py."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from embed.builder import GraphBuilder
from embed.eager import run_eager
from embed.evaluate import evaluate
from embed.inputs import random_inputs
from embed.ir import Graph
from embed.lower import lower
from embed.partition import partition_nodes
from tests.gpu import needs_gpu
from transforms.build import Source, build
from transforms.compilers import cuda
from transforms.contraction import gemm_configs, match_contraction
from transforms.plan import (
    LOAD,
    STORE,
    Plan,
    PlanError,
    Step,
    Target,
    fold_side,
    kernel_of,
    kernel_step,
    read_plan,
    save_plan,
    step_subgraph,
    verify,
)
from transforms.plan_runtime import PlanModule
from transforms.run import Scalar
from transforms.space import default_recipe
from transforms.views import fold_layout, fold_loads

SIDES = {STORE: (0, (1,)), LOAD: (2, (1,))}  # the kernel step that runs the transpose, and what it folds


def block(*, also_output: bool = False) -> Graph:
    """x[16, 32] @ w[32, 24] -> gelu -> transpose -> softmax over the last axis: a transpose between two kernels
    (``also_output``: the transposed value is a model output too)."""
    g = GraphBuilder("block")
    y = g.node("matmul", [g.input("x", (16, 32), "float32"), g.param("w", (32, 24), "float32")], (16, 24), "float32")
    t = g.node("transpose", [g.node("gelu", [y], (16, 24), "float32")], (24, 16), "float32", name="t", perm=[1, 0])
    out = g.node("softmax", [t], (24, 16), "float32", name="out", axis=-1)
    return g.build([out, t] if also_output else [out])


def plan_of(graph: Graph, kernels: dict[int, tuple[int, ...]], backend: str = "cpu") -> Plan:
    """The plan running step k as its default kernel with the layout steps ``kernels[k]`` folded, the rest eager."""
    parts = partition_nodes(graph)
    steps = [Step(s.structural_hash, "eager") for s, _ in parts]
    for k, folded in kernels.items():
        merged = step_subgraph(graph, parts, k, folded)
        program = lower(merged.graph)
        recipe = str(default_recipe(fold_layout(program) if folded else program, backend))
        steps[k] = kernel_step(merged, recipe, backend, folded=folded, structural_hash=parts[k][0].structural_hash)
        for j in folded:
            steps[j] = Step(parts[j][0].structural_hash, "folded")
    return Plan(graph, tuple(steps), Target(backend, backend, backend, "", "test"))


def check_against_eager(plan: Plan, cache_dir: Path, device: str = "cpu") -> None:
    inputs = random_inputs(plan.graph, seed=1)
    expected = run_eager(plan.graph, {n: torch.as_tensor(v) for n, v in inputs.items()}, compute_dtype=torch.float64)
    params = {n: torch.as_tensor(v) for n, v in inputs.items() if n != "x"}
    module = PlanModule(plan, params, cache_dir=cache_dir, device=device)
    got = module(torch.as_tensor(inputs["x"]).to(device))
    got = got if isinstance(got, tuple) else (got,)
    for name, value in zip(plan.graph.outputs, got, strict=True):
        torch.testing.assert_close(value.cpu().double(), expected[name], rtol=1e-4, atol=1e-5)


def test_the_transpose_is_a_layout_subgraph_between_two_kernel_subgraphs_and_folds_on_either_side() -> None:
    graph = block()
    parts = partition_nodes(graph)
    assert [s.kind.value for s, _ in parts] == ["contraction", "layout", "reduction"]
    assert fold_side(graph, parts, 0, 1) == STORE and fold_side(graph, parts, 2, 1) == LOAD
    assert fold_side(graph, parts, 0, 2) is None  # a reduction is no layout step
    exposed = block(also_output=True)  # the model outputs the transposed value: the softmax cannot own it
    assert fold_side(exposed, partition_nodes(exposed), 2, 1) is None
    assert fold_side(exposed, partition_nodes(exposed), 0, 1) == STORE


@pytest.mark.parametrize("op", ["transpose", "reshape", "slice"])
def test_fold_loads_reads_the_copied_input_through_the_copy_map(op: str) -> None:
    g = GraphBuilder(op)
    x = g.input("x", (8, 12), "float32")
    if op == "transpose":
        t = g.node("transpose", [x], (12, 8), "float32", perm=[1, 0])
    elif op == "reshape":
        t = g.node("reshape", [x], (4, 24), "float32", shape=[4, 24])
    else:
        t = g.node("slice", [x], (8, 5), "float32", axis=1, start=2, end=12, step=2)
    graph = g.build([g.node("softmax", [t], g.tensors[t].shape, "float32", axis=-1)])
    program = lower(graph)
    folded = fold_loads(program)
    assert [n.op for n in program.nests][0] == op and op not in [n.op for n in folded.nests]
    assert folded.buffers == program.buffers  # the kernel's arguments do not change
    inputs = random_inputs(graph, seed=0)
    np.testing.assert_allclose(evaluate(folded, inputs)[graph.outputs[0]], evaluate(program, inputs)[graph.outputs[0]],
                               rtol=1e-12)


@pytest.mark.parametrize("side", [STORE, LOAD])
def test_a_folded_transpose_has_no_step_of_its_own_and_the_plan_computes_what_eager_computes(
        side: str, tmp_path: Path) -> None:
    k, folded = SIDES[side]
    plan = plan_of(block(), {0: (), 2: ()} | {k: folded})
    assert [s.impl for s in plan.steps] == ["kernel", "folded", "kernel"] and plan.folds == {1: k}
    merged, _ = verify(plan)
    if side == LOAD:  # the softmax reads the gelu's output through the transpose: no copy nest is left
        assert "transpose" not in [n.op for n in fold_layout(lower(merged[k].graph)).nests]
    check_against_eager(plan, tmp_path)
    save_plan(plan, tmp_path / "p.tbplan")
    assert read_plan(tmp_path / "p.tbplan")[0].steps == plan.steps


def test_the_transpose_folds_into_the_store_when_the_model_also_outputs_it(tmp_path: Path) -> None:
    check_against_eager(plan_of(block(also_output=True), {0: (1,), 2: ()}), tmp_path)


def test_an_eager_transpose_is_a_view_and_the_kernel_after_it_reads_a_contiguous_copy(tmp_path: Path) -> None:
    plan = plan_of(block(), {2: ()})  # matmul+gelu and the transpose eager, the softmax a kernel
    inputs = random_inputs(plan.graph, seed=1)
    module = PlanModule(plan, {"w": torch.as_tensor(inputs["w"])}, cache_dir=tmp_path)
    env = {"w": torch.as_tensor(inputs["w"]), "x": torch.as_tensor(inputs["x"])}
    for step in module.steps[:2]:
        step(env)
    source = next(t for t in env if t not in ("w", "x", "t"))
    assert env["t"].data_ptr() == env[source].data_ptr() and not env["t"].is_contiguous(), "no data moved"
    check_against_eager(plan, tmp_path)


def test_verify_refuses_folds_the_graph_does_not_allow() -> None:
    exposed = block(also_output=True)
    good = plan_of(block(), {0: (), 2: (1,)})
    bad = plan_of(exposed, {0: (), 2: ()})
    steps = list(bad.steps)
    steps[1] = Step(steps[1].structural_hash, "folded")
    steps[2] = Step(steps[2].structural_hash, "kernel", good.steps[2].recipe, good.steps[2].code,
                    good.steps[2].launches, (1,))
    with pytest.raises(PlanError, match="neither produces nor alone consumes"):
        verify(Plan(exposed, tuple(steps), bad.target))
    unclaimed = list(good.steps)
    unclaimed[2] = plan_of(block(), {0: (), 2: ()}).steps[2]
    with pytest.raises(PlanError, match="no kernel step runs it"):
        verify(Plan(good.graph, tuple(unclaimed), good.target))
    tampered = list(good.steps)
    tampered[2] = replace(good.steps[2], folded=())  # the merged kernel passed off as the softmax's own
    tampered[1] = Step(tampered[1].structural_hash, "eager")
    with pytest.raises(PlanError, match="differs from what its recipe generates"):
        verify(Plan(good.graph, tuple(tampered), good.target))


@pytest.mark.skipif(not cuda.available(), reason="no NVRTC or nvcc")
def test_cuda_kernels_with_folded_transposes_compile_to_ptx(tmp_path: Path) -> None:
    plans = [plan_of(block(), {0: (), 2: ()} | {k: folded}, backend="cuda") for k, folded in SIDES.values()]
    codes = [s.code for p in plans for s in p.steps if s.folded and s.code]
    assert len(codes) == 2
    results = build([Source(code, "cuda") for code in codes], cache_dir=tmp_path)
    assert [r.error[:400] for r in results if not r.ok] == []


@needs_gpu
@pytest.mark.parametrize("side", [STORE, LOAD, "none"])
def test_cuda_folded_transposes_compute_what_eager_computes(side: str, tmp_path: Path) -> None:
    k, folded = SIDES.get(side, (0, ()))
    plan = plan_of(block(), {0: (), 2: ()} | {k: folded}, backend="cuda")
    check_against_eager(plan, tmp_path, device="cuda")


def token_mixing() -> Graph:
    """x[2, 6, 5] transposed to [2, 5, 6], @ w[6, 4] + bias: a GEMM whose A is a transposed input (ResMLP's and
    MLP-Mixer's token mixing)."""
    g = GraphBuilder("mixing")
    t = g.node("transpose", [g.input("x", (2, 6, 5), "float32")], (2, 5, 6), "float32", perm=[0, 2, 1])
    y = g.node("matmul", [t, g.param("w", (6, 4), "float32")], (2, 5, 4), "float32")
    return g.build([g.node("add", [y, g.param("bias", (4,), "float32")], (2, 5, 4), "float32", name="out")])


def mixing_plan(recipe: str, backend: str) -> Plan:
    """The transpose folded into the loads of the GEMM step, run under ``recipe``."""
    graph = token_mixing()
    parts = partition_nodes(graph)
    merged = step_subgraph(graph, parts, 1, (0,))
    steps = (Step(parts[0][0].structural_hash, "folded"),
             kernel_step(merged, recipe, backend, folded=(0,), structural_hash=parts[1][0].structural_hash))
    return Plan(graph, steps, Target(backend, backend, backend, "", "test"))


def test_a_transpose_folded_into_a_gemms_loads_is_its_transposed_operand() -> None:
    graph = token_mixing()
    parts = partition_nodes(graph)
    assert [s.kind.value for s, _ in parts] == ["layout", "contraction"] and fold_side(graph, parts, 1, 0) == LOAD
    c = match_contraction(fold_layout(lower(step_subgraph(graph, parts, 1, (0,)).graph)))
    assert c is not None and (c.m, c.n, c.k) == (5, 4, 6)
    assert (c.a.outer, c.a.k, c.a.batch) == (1, 5, (30,))  # A[b, m, k] is x[b, k, m]: m contiguous
    assert {g.path for g in gemm_configs(c)} == {"cublaslt", "cublas"}  # generated tiles load A k-contiguous
    for path, library in (("cublaslt,0", "cublaslt_matmul"), ("cublas", "cublas_gemm")):
        (launch, *_) = kernel_of(step_subgraph(graph, parts, 1, (0,)), f"gemm({path})", "cuda", fold=True).launches
        scalars = {a.name: a.value for a in launch.args if isinstance(a, Scalar)}
        # column-major C^T[4 x 5] = w^T[4 x 6] (w as stored: op N, ld 4) x (x[b] as stored [5 x 6], ld 5)^T
        assert launch.library == library
        assert {k: scalars[k] for k in ("trans_a", "trans_b", "m", "n", "k", "lda", "ldb", "stride_b")} == {
            "trans_a": 0, "trans_b": 1, "m": 4, "n": 5, "k": 6, "lda": 4, "ldb": 5, "stride_b": 30}


def test_a_k_major_gemm_launch_names_no_transposed_operand() -> None:
    g = GraphBuilder("linear")
    y = g.node("matmul", [g.input("x", (5, 6), "float32"), g.param("w", (6, 4), "float32")], (5, 4), "float32")
    (launch,) = kernel_of(partition_nodes(g.build([y]))[0][0], "gemm(cublas)", "cuda").launches
    assert "trans_b" not in {a.name for a in launch.args if isinstance(a, Scalar)}  # plans saved before stay valid


def test_the_cpu_blas_gemm_reads_a_transposed_input_through_its_strides(tmp_path: Path) -> None:
    check_against_eager(mixing_plan("gemm(blas)", "cpu"), tmp_path)


@needs_gpu
@pytest.mark.parametrize("recipe", ["gemm(cublaslt,0)", "gemm(cublas)"])
def test_a_vendor_gemm_reads_a_transposed_input_on_the_gpu(recipe: str, tmp_path: Path) -> None:
    check_against_eager(mixing_plan(recipe, "cuda"), tmp_path, device="cuda")
