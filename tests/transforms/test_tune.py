"""tune() end to end on the cpu backend, and the ``tunebank tune`` command."""

import json
import math
import random
import threading
from pathlib import Path

import typer
from typer.testing import CliRunner

from embed.builder import GraphBuilder
from transforms import build
from transforms import tune as tune_module
from transforms.results import BuildResult, RunResult
from transforms.space import RecipeSpace
from transforms.tune import evaluator, make_task, tasks_of, tune
from tunebank.cli.tune import tune_command


def _graph():
    b = GraphBuilder("m")
    x, w = b.input("x", (8, 32), "float32"), b.param("w", (32, 16), "float32")
    y = b.node("matmul", [x, w], (8, 16), "float32")
    z = b.node("relu", [y], (8, 16), "float32")
    return b.build([b.node("softmax", [z], (8, 16), "float32", name="out", axis=-1)])


def test_tune_reports_each_subgraph(tmp_path: Path) -> None:
    seen = []
    results = tune(_graph(), strategy="random", budget=3, cache_dir=tmp_path, repeats=2,
                   progress=lambda task, done, total: seen.append((done, total)))
    assert [r.kind for r in results] == ["contraction", "reduction"]
    for r in results:
        assert r.evaluated == 4 and r.failed == 0 and r.space_size > 1000
        assert math.isfinite(r.default_s) and math.isfinite(r.best_s) and r.eager_s > 0
        assert r.best_recipe
    assert seen[-1] == (3, 3)


def test_cli_tune(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TUNEBANK_DATA_DIR", str(tmp_path))
    path = tmp_path / "g.json"
    path.write_text(_graph().model_dump_json())
    app = typer.Typer()
    app.command()(tune_command)
    runner = CliRunner()
    result = runner.invoke(app, [str(path), "--budget", "2", "--json", "--strategy", "evolutionary"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["kind"] for r in rows] == ["contraction", "reduction"] and all(r["evaluated"] == 3 for r in rows)
    bad = runner.invoke(app, [str(path), "--strategy", "nope"])
    assert bad.exit_code == 2 and "unknown strategy" in bad.output


def _candidates_and_trials_seen(tmp_path: Path, monkeypatch, backend: str) -> list[int]:
    """How many candidates had compiled when each trial reached the runner (compiles and runs faked); the last
    candidate's compile waits (up to 5 s) for the first trial to be run."""
    task = make_task(tasks_of(_graph())[0].graph)
    space = RecipeSpace(task.program, backend)
    rng = random.Random(0)
    recipes = list(dict.fromkeys([space.default, *(space.sample(rng) for _ in range(40))]))[:3]
    compiled: list[str] = []
    first_trial_ran = threading.Event()

    def compile_fake(code, **_):
        if len(compiled) == 2:
            first_trial_ran.wait(5)
        compiled.append(code)
        return BuildResult(backend, artifact=f"k{len(compiled)}")

    seen: list[int] = []

    def run_fake(trials, **_):
        results = []
        for _ in trials:
            seen.append(len(compiled))
            first_trial_ran.set()
            results.append(RunResult(ok=True, median_s=1e-3, min_s=1e-3, repeats=3))
        return results

    monkeypatch.setitem(build.COMPILERS, backend, compile_fake)
    monkeypatch.setattr(tune_module, "run", run_fake)
    assert len(evaluator(task, backend=backend, cache_dir=tmp_path, jobs=1)(recipes)) == 3
    return seen


def test_on_cpu_every_candidate_compiles_before_any_is_timed(tmp_path: Path, monkeypatch) -> None:
    # compilers would take the cores the timed cpu kernels run on
    assert _candidates_and_trials_seen(tmp_path, monkeypatch, "cpu") == [3, 3, 3]


def test_on_cuda_the_first_candidate_runs_while_the_others_compile(tmp_path: Path, monkeypatch) -> None:
    assert _candidates_and_trials_seen(tmp_path, monkeypatch, "cuda")[0] < 3


def test_eager_is_timed_on_the_values_a_candidate_is_checked_on(monkeypatch):
    import numpy as np
    import torch

    from embed.eager import TORCH_DTYPES
    from transforms.problem import quantized_inputs

    b = GraphBuilder("mixed")
    x = b.input("x", (64, 48), "bfloat16")
    w = b.param("w", (48, 32), "float16")
    y = b.input("y", (64, 32), "float32")
    prod = b.node("matmul", [b.node("cast", [x], (64, 48), "float32", dtype="float32"),
                             b.node("cast", [w], (48, 32), "float32", dtype="float32")], (64, 32), "float32")
    task = make_task(b.build([b.node("add", [prod, y], (64, 32), "float32", name="out")]))
    seen = {}

    def run_eager(graph, tensors):
        seen.update(tensors)

    monkeypatch.setattr("embed.eager.run_eager", run_eager)
    tune_module.eager_seconds(task, repeats=1, backend="cpu")
    want = quantized_inputs(task.graph, task.program)  # float64 values rounded to each input's dtype
    assert set(seen) == set(want)
    for name, values in want.items():
        assert seen[name].dtype == TORCH_DTYPES[task.graph.tensors[name].dtype]
        np.testing.assert_array_equal(seen[name].to(torch.float64).numpy(), values)


def _compiled_by_the_evaluator(task, recipes, backend: str, best_s: float, tmp_path: Path, monkeypatch) -> list:
    """(code, arch) of each source the evaluator compiles for ``recipes`` (compiles fail, so nothing runs)."""
    compiled = []

    def compile_fake(code, **options):
        compiled.append((code, options.get("arch", "")))
        return BuildResult(backend, error_kind="compile", error="not compiled in this test")

    monkeypatch.setitem(build.COMPILERS, backend, compile_fake)
    evaluator(task, backend=backend, cache_dir=tmp_path, best_s=best_s)(recipes)
    return compiled


class _Queue:
    def __init__(self) -> None:
        self.sources = []

    def submit(self, sources) -> None:
        self.sources.extend(sources)


def test_compile_ahead_queues_the_sources_the_evaluator_then_compiles(tmp_path: Path, monkeypatch) -> None:
    task = make_task(tasks_of(_graph())[0].graph)
    space = RecipeSpace(task.program, "cuda")
    rng = random.Random(1)
    recipes = list(dict.fromkeys([space.default, *(space.sample(rng) for _ in range(40))]))[:6]
    for best_s in (math.inf, 1e-9):  # at 1 ns known, the launch bound leaves out every recipe but the default
        queue = _Queue()
        tune_module.compile_ahead(task, recipes, backend="cuda", ahead=queue, best_s=best_s)
        compiled = _compiled_by_the_evaluator(task, recipes, "cuda", best_s, tmp_path, monkeypatch)
        assert [(s.code, s.arch) for s in queue.sources] == compiled
        assert len(compiled) == (len(recipes) if best_s == math.inf else 1)


def test_nothing_compiles_ahead_on_cpu(tmp_path: Path) -> None:
    task = make_task(tasks_of(_graph())[0].graph)
    queue = _Queue()
    tune_module.compile_ahead(task, [RecipeSpace(task.program, "cpu").default], backend="cpu", ahead=queue)
    assert queue.sources == []
