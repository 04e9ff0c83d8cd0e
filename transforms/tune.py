"""Tuning: search the recipe space of each subgraph, building, validating and timing candidates.

    results = tune(graph_or_subgraph, strategy="random", backend="cpu", budget=32, cache_dir=Path(".cache"))

One :class:`Task` per tunable subgraph holds its loop program and one validation :class:`Problem` (random
inputs in the buffer dtypes, reference from ``embed.evaluate``; ``transforms.problem``: a cuda worker builds it
on its GPU, the host only when something reads its arrays). Candidates are generated
and compiled in parallel (``transforms.build``), then validated and timed one at a time
(``transforms.run``).
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import numpy as np

from embed.features import static_features
from embed.inputs import random_inputs
from embed.ir import Graph
from embed.loopnest import LoopProgram
from embed.lower import lower
from embed.partition import partition
from embed.profile import work
from embed.subgraph import Subgraph
from transforms.build import Ahead, Source, build_each
from transforms.codegen import Kernel, generate
from transforms.compilers import cuda
from transforms.launch_bound import fewest_seconds
from transforms.problem import described_problem
from transforms.recipe import Recipe
from transforms.reorder import chain_orders, chains, describe
from transforms.results import RunResult
from transforms.run import SLOWER_FACTOR, Problem, Trial, Worker, fastest, run
from transforms.schedule import ScheduleError
from transforms.search import create
from transforms.search.strategy import Evaluate, Strategy, search
from transforms.space import RecipeSpace, default_recipe
from transforms.transformation import apply_recipe
from transforms.views import kernel_program


@dataclass(frozen=True)
class Task:
    """One subgraph to tune: its graph, kind, loop program and validation problem."""

    name: str
    kind: str
    graph: Graph
    program: LoopProgram
    problem: Problem
    key: str = ""  # the subgraph's structural hash, when it came from one


@dataclass(frozen=True)
class TuneResult:
    """The outcome for one subgraph; times are medians in seconds (inf when nothing validated)."""

    name: str
    kind: str
    space_size: int
    eager_s: float
    default_recipe: str
    default_s: float
    best_recipe: str | None
    best_s: float
    evaluated: int
    failed: int

    @property
    def speedup(self) -> float:
        """Best over the default recipe (>1 is faster)."""
        return self.default_s / self.best_s if math.isfinite(self.best_s) and self.best_s > 0 else 0.0

    @property
    def speedup_vs_eager(self) -> float:
        return self.eager_s / self.best_s if math.isfinite(self.best_s) and self.best_s > 0 else 0.0


@dataclass(frozen=True)
class OrderResult:
    """One reorderable chain (``transforms.reorder``): the graph's time with ``A·(X·W)`` and with ``(A·X)·W``,
    each the sum of its subgraphs' best times (inf when one did not validate)."""

    chain: str
    original_s: float
    reordered_s: float

    @property
    def winner(self) -> str:
        return "(A·X)·W" if self.reordered_s < self.original_s else "A·(X·W)"


class TuneResults(list[TuneResult]):
    """The per-subgraph results; ``orders`` holds the chain comparisons of ``tune(..., reorder=True)``."""

    orders: list[OrderResult]

    def __init__(self, results: Sequence[TuneResult] = (), orders: Sequence[OrderResult] = ()) -> None:
        super().__init__(results)
        self.orders = list(orders)


def make_task(subgraph: Subgraph | Graph, *, seed: int = 0, name: str = "", fold: bool = False) -> Task:
    """The task of tuning ``subgraph``: its kernels' program (``transforms.views.kernel_program``; ``fold``: a plan's
    kernel step with layout steps folded into it) and the problem its candidates are checked on."""
    graph = subgraph.graph if isinstance(subgraph, Subgraph) else subgraph
    kind = subgraph.kind.value if isinstance(subgraph, Subgraph) else "graph"
    program = lower(graph)
    folded = kernel_program(program, subgraph.kind if isinstance(subgraph, Subgraph) else None, fold=fold)
    return Task(name or graph.name, kind, graph, folded, described_problem(graph, program, seed=seed))


def kernels(program: LoopProgram, recipes: Sequence[Recipe], backend: str) -> list[Kernel | str]:
    """The generated kernel of each recipe, or the reason it could not be applied."""
    out: list[Kernel | str] = []
    for recipe in recipes:
        try:
            out.append(generate(apply_recipe(recipe, program), backend))
        except ScheduleError as e:
            out.append(str(e))
    return out


def evaluator(
    task: Task, *, backend: str, cache_dir: Path, worker: Worker | None = None, jobs: int = os.cpu_count() or 4,
    repeats: int = 10, timeout_s: float = 30.0, best_s: float = math.inf,
) -> Callable[[list[Recipe]], list[RunResult]]:
    """``evaluate(recipes) -> results`` for ``task``: generate, compile, validate and time (a candidate far slower
    than the fastest measured so far, or than ``best_s`` known before, is timed by one call:
    ``transforms.run.SLOWER_FACTOR``; on cuda one whose launch cannot come within that factor of it is not run:
    error kind "slow", ``transforms.launch_bound``; the default recipe, every subgraph's baseline, always runs)."""
    incumbent = best_s
    candidates = _Candidates(task, backend)

    def evaluate_recipes(recipes: list[Recipe]) -> list[RunResult]:
        nonlocal incumbent
        made = candidates.made(recipes, incumbent)
        ok = [k for k in made if isinstance(k, Kernel)]
        builds = build_each([candidates.source(k) for k in ok], cache_dir=cache_dir, jobs=jobs)
        # cuda: a candidate runs while the later ones compile (the GPU's timing does not feel the host's load); cpu:
        # every compile ends first, since compilers would take the cores the timed kernels run on
        built = builds if backend == "cuda" else iter(list(builds))
        trials = (Trial(b, k.launches, task.problem) for b, k in zip(built, ok, strict=True))
        measured = run(trials, worker=worker, repeats=repeats, timeout_s=timeout_s, warmup=2, best_s=incumbent)
        incumbent = fastest(measured, incumbent)
        results = iter(measured)
        return [next(results) if isinstance(k, Kernel) else k for k in made]

    return evaluate_recipes


def compile_ahead(task: Task, recipes: Sequence[Recipe], *, backend: str, ahead: Ahead, best_s: float = math.inf) \
        -> None:
    """Queue on ``ahead`` the sources an :func:`evaluator` of ``task`` with ``best_s`` will compile for ``recipes``
    (those the launch bound leaves in), so that its build finds them compiled or compiling. On cuda only: on cpu the
    compiles would take the cores the timed kernels run on."""
    if backend != "cuda":
        return
    candidates = _Candidates(task, backend)
    ahead.submit(candidates.source(k) for k in candidates.made(recipes, best_s) if isinstance(k, Kernel))


class _Candidates:
    """A task's recipes as the kernels an evaluator compiles, or the results of those it does not run."""

    def __init__(self, task: Task, backend: str) -> None:
        self.task, self.backend = task, backend
        self.flops = work(static_features(task.program))[0] if backend == "cuda" else 0.0
        self.default = functools.cache(lambda: default_recipe(task.program, backend))  # made only for one left out

    def made(self, recipes: Sequence[Recipe], best_s: float) -> list[Kernel | RunResult]:
        """Per recipe its kernel, or the failure to make one; on cuda a kernel whose launch cannot come near
        ``best_s`` is left out as "slow" (:func:`out_of_reach`), but never the default recipe's."""
        made: list[Kernel | RunResult] = [k if isinstance(k, Kernel) else RunResult.failure("launch", k)
                                          for k in kernels(self.task.program, recipes, self.backend)]
        if self.backend != "cuda":
            return made
        return [self._left_out(r, k, best_s) for r, k in zip(recipes, made, strict=True)]

    def _left_out(self, recipe: Recipe, made: Kernel | RunResult, best_s: float) -> Kernel | RunResult:
        slow = out_of_reach(made, self.flops, best_s) if isinstance(made, Kernel) else None
        return made if slow is None or recipe == self.default() else slow

    def source(self, kernel: Kernel) -> Source:
        """What compiles ``kernel``: on cuda, machine code for the GPU the worker runs on."""
        return Source(kernel.code, self.backend, arch=cuda.device_arch() if self.backend == "cuda" else "")


def out_of_reach(kernel: Kernel, flops: float, best_s: float) -> RunResult | None:
    """The "slow" result of a cuda ``kernel`` whose launch cannot take under ``SLOWER_FACTOR`` times ``best_s``
    (``transforms.launch_bound``), else None."""
    bound = fewest_seconds(kernel, flops)
    if bound is None or not bound > SLOWER_FACTOR * best_s:
        return None
    return RunResult.failure("slow", f"not run: its launch takes at least {bound * 1e6:.4g} us for {flops:.4g} flops, "
                                     f"over {SLOWER_FACTOR:g}x the {best_s * 1e6:.4g} us known for the subgraph")


def eager_seconds(task: Task, *, repeats: int = 10, backend: str = "cpu") -> float:
    """Median time of the subgraph in eager PyTorch (the baseline): on the cpu by wall clock; on cuda timed
    like the candidates (CUDA-graph replay over input copies past L2, CUDA events). NaN when torch (or its
    GPU) is missing or the graph does not run eagerly there."""
    try:
        import torch

        from embed.eager import TORCH_DTYPES, run_eager
    except ImportError:
        return math.nan
    # the graph's dtypes as drawn (bfloat16 as float32 holding its values): the values quantized_inputs gives, without
    # its float64 copies (on 2 cores, llama_block's 16 subgraphs drew theirs in 0.80 s against 1.26 s)
    inputs = random_inputs(task.graph, seed=0)
    dtypes = {n: TORCH_DTYPES[task.graph.tensors[n].dtype] for n in inputs}
    if backend == "cuda":
        from transforms.eager_cuda import graph_replay_seconds

        return graph_replay_seconds(lambda t: run_eager(task.graph, t), inputs, dtypes, repeats=repeats)
    tensors = {n: torch.as_tensor(v).to(dtypes[n]) for n, v in inputs.items()}
    times = []
    for _ in range(repeats + 2):
        start = time.perf_counter()
        run_eager(task.graph, tensors)
        times.append(time.perf_counter() - start)
    return float(np.median(times[2:]))


def tasks_of(target: Graph | Subgraph | Sequence[Subgraph], *, seed: int = 0) -> list[Task]:
    """One task per distinct tunable subgraph of ``target`` (a model graph is partitioned first)."""
    if isinstance(target, Graph):
        target = partition(target)
    subs = [target] if isinstance(target, Subgraph) else list(target)
    unique = {s.structural_hash: s for s in subs if s.tunable}
    return [replace(make_task(s, seed=seed, name=f"{s.graph.name} ({'+'.join(s.ops)})"), key=key)
            for key, s in unique.items()]


Progress = Callable[[Task, int, int], None]  # (task, evaluated so far, budget)


class Recorder(Protocol):
    """Where ``tune`` reports what it measures, as it measures it (e.g. into the database)."""

    def measured(self, task: Task, recipes: Sequence[Recipe], results: Sequence[RunResult]) -> None: ...

    def baseline(self, task: Task, default_s: float, eager_s: float) -> None: ...


def _recorded(evaluate: Evaluate, task: Task, recorder: Recorder) -> Evaluate:
    def evaluate_and_record(recipes: list[Recipe]) -> list[RunResult]:
        results = evaluate(recipes)
        recorder.measured(task, recipes, results)
        return results

    return evaluate_and_record


def tune(
    target: Graph | Subgraph | Sequence[Subgraph],
    *,
    strategy: str = "random",
    backend: str = "cpu",
    budget: int = 32,
    cache_dir: Path,
    seed: int = 0,
    repeats: int = 10,
    progress: Progress | None = None,
    reorder: bool = False,
    timeout_s: float = 30.0,
    recorder: Recorder | None = None,
) -> TuneResults:
    """Tune every distinct tunable subgraph of ``target``: the default recipe first, then the space's vendor
    alternatives (``RecipeSpace.alternatives``), then ``budget`` recipes proposed by ``strategy`` (exhaustive | random
    | evolutionary) in batches.

    With ``reorder`` (a model graph only), the subgraphs of every order of its sparse-dense chains
    (``transforms.reorder.chain_orders``) are tuned too, and ``orders`` compares the orders of each chain.
    ``timeout_s`` bounds each candidate's validation and timing in the worker. ``recorder`` is told every batch of
    measurements as it is taken, and each subgraph's default and eager times."""
    graphs = chain_orders(target) if reorder and isinstance(target, Graph) else []
    parts = [partition(g) for g in graphs]
    results = TuneResults()
    best_by_key: dict[str, float] = {}
    with Worker() as worker:
        for task in tasks_of([s for p in parts for s in p] if graphs else target, seed=seed):
            space = RecipeSpace(task.program, backend)
            evaluate_recipes = evaluator(task, backend=backend, cache_dir=cache_dir, worker=worker, repeats=repeats,
                                         timeout_s=timeout_s)
            if recorder is not None:
                evaluate_recipes = _recorded(evaluate_recipes, task, recorder)
            default = default_recipe(task.program, backend)
            (first,) = evaluate_recipes([default])
            search_strategy = create(strategy, space, budget=budget, seed=seed)
            search_strategy.tell([(default, first)])
            # the vendor alternatives (a library call: conv(torch), gemm(blas)), which no strategy samples
            vendor = [r for r in space.alternatives if r != default]
            search_strategy.tell(list(zip(vendor, evaluate_recipes(vendor), strict=True)) if vendor else [])

            def measured(recipes: list[Recipe], task: Task = task, ev: Evaluate = evaluate_recipes,
                         st: Strategy = search_strategy) -> list[RunResult]:
                out = ev(recipes)
                if progress:
                    progress(task, len(st.history) + len(out) - 1, budget)
                return out

            best = search(search_strategy, measured)
            history = search_strategy.history
            eager_s = eager_seconds(task, backend=backend)
            if recorder is not None:
                recorder.baseline(task, first.score, eager_s)
            results.append(TuneResult(
                name=task.name, kind=task.kind, space_size=space.size(), eager_s=eager_s,
                default_recipe=str(default), default_s=first.score,
                best_recipe=str(best[0]) if best else None, best_s=best[1].score if best else math.inf,
                evaluated=len(history), failed=sum(not r.ok for _, r in history),
            ))
            best_by_key[task.key] = results[-1].best_s
    if graphs:
        seconds = [sum(best_by_key[s.structural_hash] for s in p if s.tunable) for p in parts]
        results.orders = [OrderResult(describe(graphs[0], c), seconds[0], seconds[k + 1])
                          for k, c in enumerate(chains(graphs[0]))]
    return results
