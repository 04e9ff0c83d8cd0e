"""Attention as one fused step (``transforms.attention``): which partitions form one, a plan running it through
PyTorch's scaled dot-product attention against the float64 eager evaluation of the graph, and verify refusing an
attention step that its subgraphs do not form. The choice of fused or apart is tested in
tests/service/test_fused_attention.py."""

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from embed.builder import GraphBuilder
from embed.eager import run_eager
from embed.inputs import random_inputs
from embed.ir import Graph, TensorRole
from embed.partition import partition_nodes
from tests.gpu import needs_gpu
from transforms import attention
from transforms.plan import Plan, PlanError, Step, Target, read_plan, save_plan, verify
from transforms.plan_runtime import PlanModule
from tunebank.cli.inspect import runs_as

B, H, L, D = 2, 3, 16, 8


def attention_graph(*, scale: str = "mul", mask: bool = True, mask_first: bool = False,
                    scores_out: bool = False, scores_read: bool = False, wide_mask: bool = False) -> Graph:
    """softmax(q @ k^T (* 0.25 | / 4) [+ m]) @ v over (B, H, L, D) inputs, m a (L, L) weight; ``mask_first``: the
    mask is added before the scaling; ``scores_out``: the scores are a model output too; ``scores_read``: another
    subgraph reads the scores (s @ v is a second output); ``wide_mask``: a (2, B, H, L, L) mask, which broadcasts the
    scores up (two attentions' worth: no one fused call)."""
    g = GraphBuilder("attn")
    q, k, v = (g.input(n, (B, H, L, D), "float32") for n in ("q", "k", "v"))
    s = g.node("matmul", [q, k], (B, H, L, L), "float32", name="s", transpose_b=True)
    x = s
    if mask and mask_first:
        x = g.node("add", [x, g.param("m", (L, L), "float32")], (B, H, L, L), "float32")
    if scale == "mul":
        x = g.node("mul", [x, g.const(0.25, "float32")], (B, H, L, L), "float32")
    elif scale == "div":
        x = g.node("div", [x, g.const(4.0, "float32")], (B, H, L, L), "float32")
    wide = (2,) if wide_mask else ()
    if mask and not mask_first:
        x = g.node("add", [x, g.param("m", (*wide, B, H, L, L) if wide else (L, L), "float32")], (*wide, B, H, L, L),
                   "float32")
    p = g.node("softmax", [x], (*wide, B, H, L, L), "float32", axis=-1)
    out = g.node("matmul", [p, v], (*wide, B, H, L, D), "float32", name="out", transpose_b=False)
    if scores_read:
        return g.build([out, g.node("matmul", [s, v], (B, H, L, D), "float32", name="w")])
    return g.build([out, s] if scores_out else [out])


def fused_plan(graph: Graph) -> Plan:
    parts = partition_nodes(graph)
    steps = [Step(s.structural_hash, "eager") for s, _ in parts]
    for found in attention.find(graph, parts):
        for j in found.folded:
            steps[j] = Step(steps[j].structural_hash, "folded")
        steps[found.step] = Step(steps[found.step].structural_hash, "attention", folded=found.folded)
    return Plan(graph, tuple(steps), Target("cpu", "cpu", "cpu", "", "test"))


@pytest.mark.parametrize("scale", ["mul", "div"])
def test_an_attention_is_three_subgraphs_with_its_scale_and_mask(scale: str) -> None:
    graph = attention_graph(scale=scale)
    parts = partition_nodes(graph)
    assert [s.kind.value for s, _ in parts] == ["contraction", "reduction", "contraction"]
    (found,) = attention.find(graph, parts)
    assert found.parts == (0, 1, 2) and found.step == 2 and found.folded == (0, 1)
    assert (found.query, found.key, found.value, found.mask, found.output) == ("q", "k", "v", "m", "out")
    assert found.scale == 0.25  # * 0.25 and / 4 alike


def test_no_attention_where_the_fused_call_would_compute_something_else() -> None:
    # the mask added before the scaling is scaled too; the scores read by the model besides the softmax
    for graph in (attention_graph(mask_first=True), attention_graph(scores_out=True),
                  attention_graph(scores_read=True), attention_graph(wide_mask=True)):
        assert attention.find(graph, partition_nodes(graph)) == []
    (plain,) = attention.find(g := attention_graph(scale="none", mask=False), partition_nodes(g))
    assert plain.mask is None and plain.scale == 1.0


@pytest.mark.parametrize("scale,mask", [("mul", True), ("div", False)])
def test_a_plan_runs_the_attention_fused_as_the_graph_computes_it(tmp_path: Path, scale: str, mask: bool) -> None:
    check_fused_plan(tmp_path, scale, mask, "cpu")


@needs_gpu
def test_a_plan_runs_the_attention_fused_on_the_gpu_in_its_cuda_graph(tmp_path: Path) -> None:
    check_fused_plan(tmp_path, "mul", True, "cuda")


def check_fused_plan(tmp_path: Path, scale: str, mask: bool, device: str) -> None:
    graph = attention_graph(scale=scale, mask=mask)
    plan = fused_plan(graph)
    assert [s.impl for s in plan.steps] == ["folded", "folded", "attention"] and plan.tuned == 1
    assert runs_as(plan) == ["in attention #2", "in attention #2", "attention (fused, of #0,#1,#2)"]
    save_plan(plan, tmp_path / "a.tbplan")
    plan = read_plan(tmp_path / "a.tbplan")[0]
    inputs = {n: torch.as_tensor(v) for n, v in random_inputs(graph, seed=3).items()}
    expected = run_eager(graph, inputs, compute_dtype=torch.float64)["out"]
    params = {n: t for n, t in inputs.items() if graph.tensors[n].role == TensorRole.PARAM}
    module = PlanModule(plan, params, cache_dir=tmp_path, device=device)  # on cuda: in one CUDA graph
    got = module(inputs["q"], inputs["k"], inputs["v"])
    torch.testing.assert_close(got.cpu().double(), expected, rtol=1e-5, atol=1e-6)


def test_verify_refuses_an_attention_step_its_subgraphs_do_not_form() -> None:
    graph = attention_graph()
    plan = fused_plan(graph)
    verify(plan)
    steps = list(plan.steps)
    with pytest.raises(PlanError, match="attention"):  # the softmax step claiming to be the attention
        verify(Plan(graph, (steps[0], Step(steps[1].structural_hash, "attention", folded=(0, 2)),
                            Step(steps[2].structural_hash, "folded")), plan.target))
    with pytest.raises(PlanError, match="attention"):  # its folds listed otherwise than the partition gives them
        verify(Plan(graph, (*steps[:2], Step(steps[2].structural_hash, "attention", folded=(1, 0))), plan.target))
    with pytest.raises(PlanError):  # an attention that folds only the scores: the softmax step claims no runner
        verify(Plan(graph, (steps[0], Step(steps[1].structural_hash, "eager"),
                            Step(steps[2].structural_hash, "attention", folded=(0,))), plan.target))


def test_a_trial_validates_against_float64_and_times_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = attention_graph()
    (found,) = attention.find(graph, partition_nodes(graph))
    trial = attention.trial(found, graph, "cpu", repeats=3)
    assert trial.ok and trial.seconds > 0 and trial.error <= trial.tolerance and trial.tolerance >= 1e-4
    fused = attention.run

    def without_mask(att: attention.Attention, env: dict, **kwargs: bool) -> None:  # a fused call forgetting the mask
        fused(attention.Attention(att.parts, att.query, att.key, att.value, None, att.scale, att.output), env)

    monkeypatch.setattr(attention, "run", without_mask)
    failed = attention.trial(found, graph, "cpu", repeats=3)
    assert not failed.ok and math.isnan(failed.seconds) and failed.error > failed.tolerance


def causal_mask(rows: int, cols: int, hidden: float = -1e9) -> torch.Tensor:
    """0 where key j <= query i, ``hidden`` above: built by hand, not by the code under test."""
    return torch.tensor([[0.0 if j <= i else hidden for j in range(cols)] for i in range(rows)])


def test_a_causal_mask_is_zero_on_and_below_the_diagonal_and_hides_the_rest() -> None:
    assert attention.causal(causal_mask(L, L))
    assert attention.causal(causal_mask(L, L, -math.inf))
    assert attention.causal(causal_mask(L, L, torch.finfo(torch.float32).min))
    assert attention.causal(causal_mask(L, L)[None, None])  # broadcast over batch and heads
    assert attention.causal(causal_mask(4, 6))  # more keys than queries: SDPA's top-left diagonal
    assert not attention.causal(causal_mask(L, L, -1.0))  # added to a score, -1 leaves it weighed
    assert not attention.causal(causal_mask(L, L).T.contiguous())  # anti-causal
    shifted = causal_mask(L, L)
    shifted[3, 2] = -1e9  # one key a query should see is hidden
    assert not attention.causal(shifted)
    assert not attention.causal(causal_mask(L, L).expand(2, L, L))  # a mask per batch: not one causal mask
    assert not attention.causal(torch.zeros(L, L))


def test_a_causal_mask_is_tried_and_run_as_is_causal_and_a_plan_checks_the_weights_it_is_bound_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_causal_plan(tmp_path, monkeypatch, "cpu")


@needs_gpu
def test_a_plan_runs_a_causal_attention_on_the_gpu_in_its_cuda_graph(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    check_causal_plan(tmp_path, monkeypatch, "cuda")


def check_causal_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    graph = attention_graph()
    (found,) = attention.find(graph, partition_nodes(graph))
    trial = attention.trial(found, graph, device, mask=causal_mask(L, L).to(device), repeats=3)
    assert trial.ok and trial.is_causal and trial.error <= trial.tolerance  # against the float64 masked attention
    assert not attention.trial(found, graph, device, mask=torch.zeros(L, L, device=device), repeats=3).is_causal
    calls: list[tuple[bool, bool]] = []  # (is_causal, a mask was passed) of each fused call (on cuda: until captured)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args: torch.Tensor, attn_mask: torch.Tensor | None = None, **kwargs: object) -> torch.Tensor:
        calls.append((bool(kwargs.get("is_causal")), attn_mask is not None))
        return sdpa(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    inputs = {n: torch.as_tensor(v) for n, v in random_inputs(graph, seed=5).items()}
    for mask, expect in ((causal_mask(L, L), (True, False)), (inputs["m"], (False, True))):
        module = PlanModule(fused_plan(graph), {"m": mask}, cache_dir=tmp_path, device=device)
        calls.clear()
        got = module(inputs["q"], inputs["k"], inputs["v"])
        expected = run_eager(graph, {**inputs, "m": mask.double()}, compute_dtype=torch.float64)["out"]
        torch.testing.assert_close(got.cpu().double(), expected, rtol=1e-5, atol=1e-6)
        assert calls and set(calls) == {expect}


def test_inspect_says_which_attention_optimize_tried_causal() -> None:
    plan = fused_plan(attention_graph())
    row = {"steps": [0, 1, 2], "causal": True, "choice": "fused"}
    assert runs_as(replace(plan, report={"attentions": [row]}))[2] == "attention (fused, causal, of #0,#1,#2)"
    assert runs_as(replace(plan, report={"attentions": [{**row, "causal": False}]}))[2] == \
        "attention (fused, of #0,#1,#2)"
    assert runs_as(replace(plan, report={"attentions": "edited"}))[2] == "attention (fused, of #0,#1,#2)"
