"""Shared helpers for the code generation tests: small graphs, tasks and a cpu evaluator."""

from collections.abc import Sequence
from pathlib import Path

from embed.builder import GraphBuilder
from embed.ir import Graph
from transforms.recipe import Recipe, parse
from transforms.results import RunResult
from transforms.run import Worker
from transforms.tune import evaluator, make_task

Spec = tuple[str, Sequence[int], str]


def single(op: str, inputs: Sequence[Spec], out_shape: Sequence[int], out_dtype: str = "float32", **attrs) -> Graph:
    b = GraphBuilder(op)
    names = [b.input(n, s, d) for n, s, d in inputs]
    return b.build([b.node(op, names, out_shape, out_dtype, name="out", **attrs)])


def measure(graph: Graph, recipes: Sequence[Recipe | str], cache: Path, worker: Worker | None = None,
            backend: str = "cpu") -> list[RunResult]:
    task = make_task(graph)
    ev = evaluator(task, backend=backend, cache_dir=cache, worker=worker, repeats=1, jobs=2)
    return ev([parse(r) if isinstance(r, str) else r for r in recipes])
