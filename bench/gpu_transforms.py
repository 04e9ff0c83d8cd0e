"""GPU benchmark of the transforms tuner: eager PyTorch, default recipe, tuned best and the bound per family.

    python bench/gpu_transforms.py --out DIR [--budget 24] [--strategy local] [--exhaustive-up-to 128] [--quick]
    python bench/gpu_transforms.py --out DIR --sweep "softmax:2048x32000@threads(256)|threads(1024);..." [--sweep ...]

Needs a CUDA GPU with CuPy and PyTorch. For each family and size: eager time (PyTorch, CUDA-graph replay
over inputs rotated past L2), default-recipe time, the best of the default plus ``budget`` distinct kernels
(recipes that generate the same code as one measured before are not measured again; exhaustive when the cuda
space has at most max(budget, --exhaustive-up-to) recipes, else ``--strategy``: ``local`` mutates the best
recipe so far one dimension at a time, starting from the default; ``random``; ``evolutionary``), the search's
wall time and candidate count, the exhaustive-search cost (the space size times the measured seconds per
candidate), and the bound: minimum bytes over the measured copy bandwidth, or FLOPs over the measured cuBLAS
fp16 matmul rate. Writes ``gpu_transforms.md`` and ``gpu_transforms.json`` into DIR.

``--sweep CASES@SPEC`` (repeatable) measures instead, for each case matching ``CASES`` (as ``--cases``), every
distinct kernel of a focused product around the default recipe: ``SPEC``'s groups are separated by ``;``,
alternatives by ``|``, steps of one alternative by ``+``; each alternative replaces the default's steps of the
same names (``reduce(warp)|reduce(block)+rows_per_block(4)``). Writes ``gpu_sweep.md`` and ``gpu_sweep.json``.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from embed.builder import GraphBuilder
from embed.ir import Graph
from transforms.codegen import generate
from transforms.eager_cuda import graph_replay_seconds
from transforms.recipe import Recipe, Step, parse
from transforms.results import RunResult
from transforms.run import Worker
from transforms.schedule import ScheduleError
from transforms.search import create
from transforms.search.strategy import Strategy
from transforms.space import RecipeSpace, default_recipe
from transforms.transformation import apply_recipe
from transforms.tune import Task, eager_seconds, evaluator, make_task

F16, F32 = "float16", "float32"


@dataclass(frozen=True)
class Case:
    family: str
    size: str
    graph: Graph
    bytes: int  # minimum bytes moved: every input read once, every output written once
    flops: int = 0  # for contractions: the bound is flops / matmul rate


def _rowwise(name: str, m: int, n: int, body: Callable[[GraphBuilder, str], str], extra: int = 0) -> Case:
    b = GraphBuilder(name)
    x = b.input("x", (m, n), F16)
    out = body(b, x)
    return Case(name, f"{m}x{n}", b.build([out]), 2 * m * n * 2 + extra)


def softmax(m: int, n: int) -> Case:
    return _rowwise("softmax", m, n, lambda b, x: b.node("softmax", [x], (m, n), F16, name="out", axis=-1))


def layernorm(m: int, n: int) -> Case:
    def body(b: GraphBuilder, x: str) -> str:
        w, bias = b.param("w", (n,), F16), b.param("b", (n,), F16)
        return b.node("layer_norm", [x, w, bias], (m, n), F16, name="out", axes=[1], eps=1e-5)

    return _rowwise("layernorm", m, n, body, 4 * n)


def rmsnorm(m: int, n: int) -> Case:
    def body(b: GraphBuilder, x: str) -> str:
        return b.node("rms_norm", [x, b.param("w", (n,), F16)], (m, n), F16, name="out", axes=[1], eps=1e-6)

    return _rowwise("rmsnorm", m, n, body, 2 * n)


def add_layernorm(m: int, n: int) -> Case:
    def body(b: GraphBuilder, x: str) -> str:
        r = b.input("r", (m, n), F16)
        w, bias = b.param("w", (n,), F16), b.param("b", (n,), F16)
        s = b.node("add", [x, r], (m, n), F16)
        return b.node("layer_norm", [s, w, bias], (m, n), F16, name="out", axes=[1], eps=1e-5)

    return _rowwise("add+layernorm", m, n, body, 2 * m * n + 4 * n)


def bias_gelu(m: int, n: int) -> Case:
    def body(b: GraphBuilder, x: str) -> str:
        s = b.node("add", [x, b.param("bias", (n,), F16)], (m, n), F16)
        return b.node("gelu", [s], (m, n), F16, name="out", approximate="none")

    return _rowwise("bias+gelu", m, n, body, 2 * n)


def cross_entropy(m: int, c: int) -> Case:
    b = GraphBuilder("cross_entropy")
    logits, target = b.input("logits", (m, c), F32), b.input("target", (m,), "int64")
    logp = b.node("log_softmax", [logits], (m, c), F32, axis=1)
    loss = b.node("nll_loss", [logp, target], (), F32, name="out", reduction="mean")
    return Case("cross-entropy", f"{m}x{c}", b.build([loss]), 4 * m * c + 8 * m + 4)


def matmul_bias_gelu(m: int, k: int, n: int, dtype: str = F16) -> Case:
    b = GraphBuilder("matmul_bias_gelu")
    x, w, bias = b.input("x", (m, k), dtype), b.param("w", (k, n), dtype), b.param("bias", (n,), dtype)
    y = b.node("matmul", [x, w], (m, n), dtype)
    z = b.node("add", [y, bias], (m, n), dtype)
    out = b.node("gelu", [z], (m, n), dtype, name="out", approximate="none")
    size = f"{m}x{k}x{n}" + ("" if dtype == F16 else f" {dtype}")
    item = 4 if dtype == F32 else 2
    return Case("matmul+bias+gelu", size, b.build([out]), item * (m * k + k * n + n + m * n), 2 * m * k * n)


def gcn_spmm(nodes: int, per_row: int, feats: int) -> Case:
    b = GraphBuilder("gcn_spmm")
    nnz = nodes * per_row
    indptr, indices = b.input("indptr", (nodes + 1,), "int64"), b.input("indices", (nnz,), "int64")
    values, dense = b.input("values", (nnz,), F32), b.input("dense", (nodes, feats), F32)
    out = b.node("spmm", [indptr, indices, values, dense], (nodes, feats), F32, name="out", rows=nodes)
    # bound: the CSR arrays once, each gathered dense row once per use (at best from cache), the output once
    return Case(
        "gcn-spmm",
        f"n{nodes}-nnz/row{per_row}-f{feats}",
        b.build([out]),
        8 * (nodes + 1) + 12 * nnz + 4 * nodes * feats * 2,
    )


def selected(all_cases: list[Case], patterns: str) -> list[Case]:
    """The cases matching any comma-separated ``family`` or ``family:size`` pattern (all when empty)."""
    wanted = [p.split(":", 1) for p in patterns.split(",") if p]
    return [c for c in all_cases if not wanted or any(
        c.family == w[0] and (len(w) == 1 or c.size == w[1]) for w in wanted)]


class Distinct:
    """``evaluate(recipes)`` that measures each distinct generated kernel once: a recipe whose code and launches
    equal an earlier one's gets that one's result. ``measured`` counts the kernels measured."""

    def __init__(self, task: Task, **options: object) -> None:
        self.task = task
        self.evaluate = evaluator(task, backend="cuda", **options)  # type: ignore[arg-type]
        self.seen: dict[object, RunResult] = {}
        self.measured = 0

    def key(self, recipe: Recipe) -> object:
        try:
            kernel = generate(apply_recipe(recipe, self.task.program), "cuda")
        except ScheduleError as e:
            return str(e)
        return kernel.code, kernel.launches

    def __call__(self, recipes: list[Recipe]) -> list[RunResult]:
        keys = [self.key(r) for r in recipes]
        fresh = {k: r for k, r in zip(keys, recipes, strict=True) if k not in self.seen}
        for k, result in zip(fresh, self.evaluate(list(fresh.values())), strict=True):
            self.seen[k] = result
        self.measured += len(fresh)
        return [self.seen[k] for k in keys]


def search_distinct(strategy: Strategy, evaluate: Distinct, budget: int, batch: int = 8) -> None:
    """Ask and tell until ``budget`` distinct kernels past the first were measured or the strategy is done."""
    start = evaluate.measured
    while not strategy.done and evaluate.measured - start < budget:
        recipes = strategy.ask(min(batch, budget - (evaluate.measured - start)))
        if recipes:
            strategy.tell(list(zip(recipes, evaluate(recipes), strict=True)))


def make_strategy(name: str, space: RecipeSpace, budget: int) -> Strategy:
    """``local``: hill-climbing from the best result told (the default first); else a registered strategy.
    The strategy may ask up to 16 x ``budget`` recipes, since those generating known kernels cost nothing."""
    if name == "local":
        return create("given_candidates", space, candidates=[], local_budget=16 * budget, seed=0)
    return create(name, space, budget=16 * budget, seed=0)


def sweep_recipes(default: Recipe, spec: str) -> list[Recipe]:
    """The product of ``spec``'s groups of alternatives around ``default`` (see the module docstring)."""
    groups = [[[s for text in alt.split("+") for s in parse(text)] for alt in g.split("|")]
              for g in spec.split(";") if g.strip()]
    out = []
    for combo in itertools.product(*groups):
        steps: list[Step] = [s for alt in combo for s in alt]
        names = {s.name for s in steps}
        out.append(Recipe(tuple(s for s in default if s.name not in names) + tuple(steps)))
    return list(dict.fromkeys(out))


def cases(quick: bool) -> list[Case]:
    if quick:
        return [
            softmax(256, 512),
            layernorm(256, 512),
            rmsnorm(256, 512),
            add_layernorm(256, 512),
            bias_gelu(256, 512),
            cross_entropy(64, 1000),
            matmul_bias_gelu(64, 64, 128),
            gcn_spmm(512, 8, 32),
        ]
    return [
        softmax(65536, 128),
        softmax(8192, 4096),
        softmax(2048, 32000),
        layernorm(8192, 768),
        layernorm(8192, 4096),
        rmsnorm(8192, 768),
        rmsnorm(8192, 4096),
        add_layernorm(8192, 768),
        add_layernorm(8192, 4096),
        bias_gelu(8192, 3072),
        bias_gelu(16384, 4096),
        cross_entropy(8192, 4096),
        cross_entropy(4096, 32000),
        softmax(8, 128256),  # few, long rows: reduce(split,S)
        layernorm(8, 65536),
        cross_entropy(16, 128256),
        matmul_bias_gelu(2048, 1024, 1024),
        matmul_bias_gelu(4096, 768, 3072),
        matmul_bias_gelu(2048, 1000, 1000),
        matmul_bias_gelu(4096, 768, 3072, "bfloat16"),
        matmul_bias_gelu(2048, 1024, 1024, F32),
        gcn_spmm(131072, 8, 64),
    ]


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + written): median of 30 event-timed copies of
    1 GiB, the best of that and the graph-replayed copy (the bound should be the fastest copy seen)."""
    import torch

    n = 1 << 29  # 1 GiB of fp16 per buffer
    src, dst = torch.randn(n, device="cuda", dtype=torch.float16), torch.empty(n, device="cuda", dtype=torch.float16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(33):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    plain = float(np.median(times[3:]))
    small = src[: 1 << 27]
    replayed = graph_replay_seconds(lambda t: dst[: 1 << 27].copy_(t["x"]), {"x": small.cpu().numpy()},
                                    {"x": torch.float16}, repeats=20) * (n / (1 << 27))
    return 2 * n * 2 / min(plain, replayed)


def matmul_rate() -> float:
    """cuBLAS fp16 matmul FLOP/s on random 8192^3 operands."""
    import torch

    n = 8192
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    seconds = graph_replay_seconds(
        lambda t: t["a"] @ t["b"], {"a": a, "b": a.T.copy()}, {"a": torch.float16, "b": torch.float16}, repeats=10
    )
    return 2 * n**3 / seconds


def bench_case(
    case: Case,
    *,
    budget: int,
    strategy_name: str,
    exhaustive_up_to: int,
    cache: Path,
    worker: Worker,
    bandwidth: float,
    rate: float,
    repeats: int,
) -> dict[str, object]:
    started = time.perf_counter()
    task = make_task(case.graph)
    prepared = time.perf_counter() - started
    space = RecipeSpace(task.program, "cuda")
    evaluate = Distinct(task, cache_dir=cache, worker=worker, repeats=repeats, timeout_s=60)
    default = default_recipe(task.program, "cuda")
    (first,) = evaluate([default])
    exhaustive = space.size() <= max(budget, exhaustive_up_to)
    name = "exhaustive" if exhaustive else strategy_name
    strategy = create(name, space, budget=space.size()) if exhaustive else make_strategy(name, space, budget)
    strategy.tell([(default, first)])
    t0 = time.perf_counter()
    search_distinct(strategy, evaluate, space.size() if exhaustive else budget)
    search_s = time.perf_counter() - t0
    history = strategy.history
    best = strategy.best
    failures: dict[str, int] = {}
    for _, r in history:
        if not r.ok:
            failures[r.error_kind or "?"] = failures.get(r.error_kind or "?", 0) + 1
    first_error = next((r.error[:300] for _, r in history if not r.ok), "")
    eager = eager_seconds(task, backend="cuda", repeats=repeats)
    bound = max(case.bytes / bandwidth, case.flops / rate if case.flops else 0.0)
    best_recipe: Recipe | None = best[0] if best else None
    best_s = best[1].score if best else math.inf
    per_candidate = search_s / max(evaluate.measured - 1, 1)
    return {
        "family": case.family,
        "size": case.size,
        "bound_kind": "flops" if case.flops else "bytes",
        "bytes": case.bytes,
        "flops": case.flops,
        "bound_s": bound,
        "eager_s": eager,
        "default_recipe": str(default),
        "default_s": first.score,
        "default_iqr_s": first.iqr_s,
        "default_error": first.error[:300],
        "best_recipe": str(best_recipe) if best_recipe else None,
        "best_s": best_s,
        "best_iqr_s": best[1].iqr_s if best else None,
        "best_rel_err": best[1].max_rel_err if best else None,
        "strategy": name,
        "space_size": space.size(),
        "evaluated": evaluate.measured,
        "asked": len(history),
        "failures": failures,
        "first_error": first_error,
        "search_s": search_s,
        "seconds_per_candidate": per_candidate,
        "exhaustive_cost_s": per_candidate * space.size(),
        "prepare_s": prepared,
        "ratio_to_bound": best_s / bound if bound else math.nan,
        "default_ratio_to_bound": first.score / bound if bound else math.nan,
        "speedup_vs_eager": eager / best_s if math.isfinite(best_s) and best_s > 0 else math.nan,
    }


def sweep_case(case: Case, spec: str, *, cache: Path, worker: Worker, bandwidth: float,
               repeats: int) -> dict[str, object]:
    """Every distinct kernel of ``spec`` around the default recipe, measured; results best first."""
    task = make_task(case.graph)
    default = default_recipe(task.program, "cuda")
    evaluate = Distinct(task, cache_dir=cache, worker=worker, repeats=repeats, timeout_s=60)
    recipes = [default, *sweep_recipes(default, spec)]
    t0 = time.perf_counter()
    results = evaluate(recipes)
    bound = case.bytes / bandwidth
    rows = {str(r): (x.score, x.error_kind or "", x.error[:200]) for r, x in zip(recipes, results, strict=True)}
    ranked = sorted(rows.items(), key=lambda kv: kv[1][0])
    return {"family": case.family, "size": case.size, "bound_s": bound, "default_recipe": str(default),
            "default_s": results[0].score, "measured": evaluate.measured, "wall_s": time.perf_counter() - t0,
            "results": [{"recipe": r, "s": s, "ratio": s / bound, "error_kind": k, "error": e}
                        for r, (s, k, e) in ranked]}


def sweep_markdown(meta: dict[str, object], rows: list[dict[str, object]], top: int = 12) -> str:
    lines = ["# Focused sweep of row-kernel recipes", "",
             f"Device: {meta['device']}, {meta['date']}. Copy bandwidth {meta['copy_tbps']:.2f} TB/s. "
             "Times in ms (median of CUDA-graph replays); ratio = time / DRAM bound.", ""]
    for r in rows:
        if "error" in r:
            lines += [f"## {r['family']} {r['size']}: error: {r['error']}", ""]
            continue
        lines += [f"## {r['family']} {r['size']}: default {_ms(r['default_s'])} ms, bound {_ms(r['bound_s'])} ms, "
                  f"{r['measured']} kernels in {r['wall_s']:.0f} s", "", "| ms | ratio | recipe |", "|---|---|---|"]
        results: list[dict[str, object]] = r["results"]  # type: ignore[assignment]
        for x in results[:top]:
            lines.append(f"| {_ms(x['s'])} | {x['ratio']:.2f} | `{x['recipe']}` {x['error_kind']} |")
        failed = [x for x in results if x["error_kind"]]
        if failed:
            lines.append(f"| | | {len(failed)} failed, e.g. {failed[0]['error_kind']}: {failed[0]['error']} |")
        lines.append("")
    return "\n".join(lines)


def _ms(seconds: object) -> str:
    return "-" if not isinstance(seconds, float) or not math.isfinite(seconds) else f"{seconds * 1e3:.4f}"


def markdown(meta: dict[str, object], rows: list[dict[str, object]]) -> str:
    lines = [
        "# GPU benchmark of the transforms tuner",
        "",
        f"Device: {meta['device']} (L2 {meta['l2_mb']:.0f} MB), {meta['date']}; torch {meta['torch']}, "
        f"cupy {meta['cupy']}. Copy bandwidth {meta['copy_tbps']:.2f} TB/s (read + write), cuBLAS fp16 matmul "
        f"{meta['matmul_tflops']:.0f} TFLOP/s. Times in ms, medians of CUDA-graph replays over buffer copies that "
        "together exceed 2x L2 (eager: PyTorch, timed the same way). bound = minimum bytes / copy bandwidth, or "
        "FLOPs / matmul rate. Exhaustive cost = cuda space size x measured seconds per candidate (extrapolated "
        "unless strategy is exhaustive).",
        "",
        "| family | size | eager | default | tuned best | bound | best/bound | eager/best | searched (strategy, "
        "distinct kernels, failed, wall s) | space | exhaustive cost s | best recipe |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['family']} | {r['size']} | error: {str(r['error'])[:120]} |||||||||")
            continue
        failed = sum(r["failures"].values())  # type: ignore[union-attr]
        lines.append(
            f"| {r['family']} | {r['size']} | {_ms(r['eager_s'])} | {_ms(r['default_s'])} | {_ms(r['best_s'])} | "
            f"{_ms(r['bound_s'])} | {r['ratio_to_bound']:.2f} | {r['speedup_vs_eager']:.2f} | "
            f"{r['strategy']}, {r['evaluated']}, {failed}, {r['search_s']:.1f} | {r['space_size']} | "
            f"{r['exhaustive_cost_s']:.0f} | `{r['best_recipe']}` |"
        )
    ok = [r for r in rows if "error" not in r and math.isfinite(float(r["speedup_vs_eager"]))]  # type: ignore[arg-type]
    if ok:
        geo = math.exp(sum(math.log(float(r["speedup_vs_eager"])) for r in ok) / len(ok))  # type: ignore[arg-type]
        lines += ["", f"Geomean speedup of tuned best over eager: {geo:.2f}x over {len(ok)} cases."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", type=int, default=24, help="distinct kernels searched past the default")
    parser.add_argument("--strategy", default="local", choices=("local", "random", "evolutionary"))
    parser.add_argument("--cases", default="", help="comma-separated family or family:size patterns")
    parser.add_argument("--sweep", action="append", default=[], help="CASES@SPEC: measure a focused product "
                        "around the default recipe instead (repeatable)")
    parser.add_argument("--exhaustive-up-to", type=int, default=128, help="search spaces this small exhaustively")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of every family")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/tunebank-bench-cache"))
    args = parser.parse_args()
    import cupy
    import torch

    props = torch.cuda.get_device_properties(0)
    bandwidth, rate = copy_bandwidth(), matmul_rate()
    meta = {
        "device": props.name,
        "l2_mb": props.L2_cache_size / 1e6,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "cupy": cupy.__version__,
        "copy_tbps": bandwidth / 1e12,
        "matmul_tflops": rate / 1e12,
        "budget": args.budget,
        "exhaustive_up_to": args.exhaustive_up_to,
    }
    print(json.dumps(meta), flush=True)
    rows: list[dict[str, object]] = []
    args.out.mkdir(parents=True, exist_ok=True)
    name = "gpu_sweep" if args.sweep else "gpu_transforms" + ("_quick" if args.quick else "")
    render = sweep_markdown if args.sweep else markdown
    jobs = [(case, spec) for patterns, _, spec in (w.partition("@") for w in args.sweep)
            for case in selected(cases(args.quick), patterns)] if args.sweep else \
        [(case, "") for case in selected(cases(args.quick), args.cases)]
    with Worker() as worker:
        for case, spec in jobs:
            try:
                if spec:
                    row = sweep_case(case, spec, cache=args.cache, worker=worker, bandwidth=bandwidth,
                                     repeats=args.repeats)
                else:
                    row = bench_case(case, budget=args.budget, strategy_name=args.strategy,
                                     exhaustive_up_to=args.exhaustive_up_to, cache=args.cache, worker=worker,
                                     bandwidth=bandwidth, rate=rate, repeats=args.repeats)
            except Exception as e:  # one family's failure is a row, not the end of the benchmark
                row = {"family": case.family, "size": case.size, "error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            print(json.dumps(row, default=str)[:2000], flush=True)
            (args.out / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
            (args.out / f"{name}.md").write_text(render(meta, rows))
    print(render(meta, rows))


if __name__ == "__main__":
    main()
