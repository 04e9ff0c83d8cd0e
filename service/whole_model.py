"""The whole model, timed as one run: every way the plan can run (on cuda with and without one CUDA graph, and the
all-eager plan in a graph) against eager, interleaved (``service.model_timing.compare``); the fastest is kept when
it beats eager by ``margin`` twice, in that timing and in a second one of the two alone; else the plan becomes
all-eager without a graph, which runs the user's module itself. Eager is timed at its GPU time (its launches queued
ahead), the ways as a loop runs them: a plan that only wins because the host launches eager's ops slowly is not
kept, since on a faster host it would lose.
"""

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from embed.eager import TORCH_DTYPES
from embed.inputs import random_inputs
from embed.ir import Graph, TensorRole
from service.model_timing import compare
from service.optimize_report import OptimizeReport
from transforms.plan import Plan, PlanError
from transforms.plan_runtime import PlanModule


def random_weights(graph: Graph, device: torch.device, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random values for every graph input and weight, drawn as tunebank draws validation inputs."""
    arrays = random_inputs(graph, seed=seed)
    return {n: torch.as_tensor(np.asarray(v)).to(device, TORCH_DTYPES[graph.tensors[n].dtype])
            for n, v in arrays.items()}


def choose_runtime(plan: Plan, report: OptimizeReport, *, backend: str, cache_dir: Path,
                   params: Mapping[str, torch.Tensor] | None, inputs: Sequence[torch.Tensor] | None,
                   reference: Callable[..., object] | None, calls: int, margin: float, compare_compile: bool,
                   seed: int = 0, ties: Plan | None = None) -> tuple[Plan, PlanModule | None]:
    """Time ways to run the model whole and keep the fastest: the plan, on cuda with and without one CUDA graph,
    ``ties`` (the plan with kernels that tied with eager, ``service.optimize._ties_as_kernels``) where given, and the
    all-eager plan in one CUDA graph; when none beats eager (``reference``, by default the graph run eagerly), the
    all-eager plan without a graph, which runs ``reference`` itself. ``report.ways_s`` gets each way's seconds.
    Returns the plan kept and its module (None when the plan cannot run here)."""
    graph = plan.graph
    device = torch.device("cuda" if backend == "cuda" else "cpu")
    drawn = random_weights(graph, device, seed=seed) if params is None or inputs is None else {}
    params = params if params is not None else {n: drawn[n] for n in graph.inputs
                                                 if graph.tensors[n].role == TensorRole.PARAM}
    names = [n for n in graph.inputs if graph.tensors[n].role == TensorRole.INPUT]
    inputs = list(inputs) if inputs is not None else [drawn[n] for n in names]
    eager_plan = replace(plan.with_all_eager(), cuda_graph=False)
    ways = {"plan": plan} if backend != "cuda" else {"plan": plan, "plan without a CUDA graph":
                                                       replace(plan, cuda_graph=False)}
    if backend == "cuda" and plan.tuned:
        ways["eager in a CUDA graph"] = replace(plan.with_all_eager(), cuda_graph=True)
    try:
        eager = reference or PlanModule(eager_plan, params, cache_dir=cache_dir, device=device)
        modules = [PlanModule(way, params, cache_dir=cache_dir, device=device) for way in ways.values()]
    except PlanError:
        return plan, None
    if ties is not None:
        with contextlib.suppress(PlanError):  # a tied kernel that cannot run here: the others are timed without it
            modules.append(PlanModule(ties, params, cache_dir=cache_dir, device=device))
            ways["plan with tied kernels"] = ties
    contenders: list[Callable[..., object]] = [eager, *modules]
    if backend == "cuda" and compare_compile:
        contenders.append(torch.compile(eager))
    eager_s, *timed = compare(contenders, inputs, calls=calls, gpu_time={0})
    if backend == "cuda" and compare_compile:
        report.compile_model_s = _none_if_nan(timed.pop())
    report.eager_model_s = _none_if_nan(eager_s)
    report.ways_s = {name: t for name, t in zip(ways, timed, strict=True) if math.isfinite(t)}
    finite = [(t, n) for n, t in enumerate(timed) if math.isfinite(t)]
    seconds, best = min(finite) if finite else (math.nan, 0)
    if report.eager_model_s is not None and seconds * (1 + margin) < report.eager_model_s:
        # a second, independent timing of the winner against eager: a win that noise gave (a launch-bound eager
        # on a busy host) is not kept unless it wins again
        again_eager_s, seconds = compare([eager, modules[best]], inputs, calls=calls, gpu_time={0})
        report.eager_model_s = _none_if_nan(again_eager_s)
    if report.eager_model_s is not None and not seconds * (1 + margin) < report.eager_model_s:
        report.model_fallback = True
        report.model_s = report.eager_model_s  # what runs is eager itself: the graph's ops, or the user's module
        fallback = eager if reference is None else PlanModule(eager_plan, params, cache_dir=cache_dir,
                                                              device=device, eager_model=reference)
        return eager_plan, fallback
    kept = list(ways.values())[best]
    report.model_s = _none_if_nan(seconds)
    report.model_fallback = kept.tuned < plan.tuned
    return kept, modules[best]


def _none_if_nan(seconds: float) -> float | None:
    return seconds if math.isfinite(seconds) else None
