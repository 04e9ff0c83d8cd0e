"""Tuning: search the recipe space of each subgraph, building, validating and timing candidates.

    result = tune(subgraph, strategy="random", backend="cpu", budget=32, cache_dir=Path(".cache"), seed=0)

One :class:`Task` per tunable subgraph holds its loop program and one validation :class:`Problem` (random
inputs quantized to the buffer dtypes, float64 reference from ``embed.evaluate``). Candidates are generated
and compiled in parallel (``transforms.build``), then validated and timed one at a time
(``transforms.run``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from embed.evaluate import evaluate
from embed.inputs import random_inputs
from embed.ir import Graph
from embed.loopnest import LoopProgram
from embed.lower import lower
from embed.subgraph import Subgraph
from transforms.build import Source, build
from transforms.codegen import Kernel, generate
from transforms.codegen.kernel import compute_dtype
from transforms.codegen.signature import run_dtype, signature
from transforms.recipe import Recipe
from transforms.results import RunResult
from transforms.run import TOLERANCE, Problem, Trial, Worker, quantize, run
from transforms.schedule import ScheduleError
from transforms.transformation import apply_recipe


@dataclass(frozen=True)
class Task:
    """One subgraph to tune: its graph, kind, loop program and validation problem."""

    name: str
    kind: str
    graph: Graph
    program: LoopProgram
    problem: Problem


def make_problem(graph: Graph, program: LoopProgram, *, seed: int = 0) -> Problem:
    """Random inputs (quantized to their dtypes) and float64 reference outputs, keyed by argument name."""
    sig = signature(program, compute_dtype(program))
    raw = random_inputs(graph, seed=seed)
    quantized = {n: quantize(raw[n], run_dtype(program.buffers[n].dtype)) for n in program.inputs}
    reference = evaluate(program, quantized)
    inputs = {sig.names[n]: quantized[n] for n in program.inputs if n in sig.names}
    outputs = {sig.names[n]: reference[n] for n in program.outputs}
    return Problem(inputs, outputs, tolerances(program, sig.names))


def tolerances(program: LoopProgram, names: dict[str, str]) -> dict[str, float]:
    """Per-output tolerance: the dtype's, widened by sqrt(longest reduction) / 16 for reassociated sums."""
    longest = max((math.prod(d.extent for d in n.reduction) for n in program.nests), default=1)
    factor = max(1.0, math.sqrt(longest) / 16)
    out = {}
    for n in program.outputs:
        dtype = run_dtype(program.buffers[n].dtype)
        if dtype in TOLERANCE and program.buffers[n].dtype.is_float:
            out[names[n]] = TOLERANCE[dtype] * factor
    return out


def make_task(subgraph: Subgraph | Graph, *, seed: int = 0, name: str = "") -> Task:
    graph = subgraph.graph if isinstance(subgraph, Subgraph) else subgraph
    kind = subgraph.kind.value if isinstance(subgraph, Subgraph) else "graph"
    program = lower(graph)
    return Task(name or graph.name, kind, graph, program, make_problem(graph, program, seed=seed))


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
    task: Task, *, backend: str, cache_dir: Path, worker: Worker | None = None, jobs: int = 4,
    repeats: int = 10, timeout_s: float = 30.0,
) -> Callable[[list[Recipe]], list[RunResult]]:
    """``evaluate(recipes) -> results`` for ``task``: generate, compile, validate and time."""

    def evaluate_recipes(recipes: list[Recipe]) -> list[RunResult]:
        made = kernels(task.program, recipes, backend)
        ok = [k for k in made if isinstance(k, Kernel)]
        builds = iter(build([Source(k.code, backend) for k in ok], cache_dir=cache_dir, jobs=jobs))
        trials = [Trial(next(builds), k.launches[0], task.problem) for k in ok]
        results = iter(run(trials, worker=worker, repeats=repeats, timeout_s=timeout_s, warmup=2))
        return [next(results) if isinstance(k, Kernel) else RunResult.failure("compile", k) for k in made]

    return evaluate_recipes
