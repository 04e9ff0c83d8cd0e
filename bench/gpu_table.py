"""The GPU comparison table: tunebank against eager PyTorch, torch.compile and cuSPARSE, with bounds.

Per dense case: the bound, eager PyTorch, torch.compile (default and max-autotune, with their cold compile
times), tunebank's tuned best and tunebank's transfer result from a database. Per sparse graph: tunebank's SpMM
against cuSPARSE (through CuPy), torch.sparse and eager.

    python -m bench.gpu_table --out DIR [--budget 3] [--spmm-budget 8] [--prior JSON] [--db PATH]
                              [--only FAMILIES] [--sizes SIZES] [--quick]

Needs a CUDA GPU with CuPy and PyTorch (and, for --db, the database wheels: SQLAlchemy, FAISS, pydantic-settings,
typer, rich). Every time is a median of CUDA-graph replays over input copies that together exceed twice the L2
(``transforms.eager_cuda.graph_replay_seconds`` for PyTorch, CuPy and compiled functions; the tunebank worker
for generated kernels); the md/json say where a function could not be captured and plain calls were timed (CuPy
always; eager SpMM). Library SpMM results are checked against the float64 reference and marked when wrong.
torch.compile runs with a fresh Inductor and Triton cache per invocation (cold compiles; the process-wide
Inductor start-up is paid once beforehand and reported apart) and no CUDA graphs of its own.

tunebank tuned best: the default recipe, then either ``--budget`` random recipes (exhaustive when the space has at
most ``--exhaustive-up-to`` recipes), or, for a case that ``--prior`` (a gpu_transforms / gpu_table JSON) has a
best recipe for, that recipe re-timed (with each value of every knob it does not set: ``with_new_knobs``) plus
``--budget`` local mutations of the best. SpMM graphs: the first is
searched at random with ``--spmm-budget`` recipes, each later one starts from the default, the best recipes of
the graphs before it (and the graph's own from ``--prior``) and ``--spmm-budget`` local mutations.

transfer (``--db PATH``, a SQLite tunebank database filled from other shapes on this device class): what
``tunebank tune --strategy transfer`` runs (``service.tune_transfer.transfer_model``), per case: its wall time
(encoder fit, neighbour search, measuring the default and the neighbours' recipes) and the winner's time; then the
tuned best and the transfer winner timed again side by side in one call (``head_to_head``). Dense cases only:
transfer_model validates on random inputs of the graph's shapes, not on the benchmark's CSR.

Writes DIR/gpu_table.md and DIR/gpu_table.json (``_quick`` with --quick). The whole table took 7.5 minutes on an
H200 with the defaults and ``--prior bench/results/gpu_transforms_h200.json`` (SpMM 2.5 of them, max-autotune's
compiles 2); larger budgets can be split across two device calls of under 9 minutes: ``--only gcn-spmm`` in one,
the dense families (``--only softmax,layernorm,...``, or ``--sizes``) in the other, each with its own --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import torch_baselines as tb
from bench.gpu_table_report import markdown
from bench.gpu_transforms import Case, cases, copy_bandwidth, matmul_rate
from bench.spmm_graphs import SpmmCase, spmm_cases, spmm_task
from embed.ir import Graph
from transforms.problem import quantized_inputs
from transforms.recipe import parse
from transforms.run import Worker
from transforms.search import create
from transforms.search.strategy import Evaluate, search
from transforms.space import RecipeSpace, default_recipe
from transforms.tune import Task, evaluator, make_task

SPMM = "gcn-spmm"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_table", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget", type=int, default=3, help="recipes searched per dense case after the default")
    p.add_argument("--exhaustive-up-to", type=int, default=0, help="search spaces this small exhaustively")
    p.add_argument("--spmm-budget", type=int, default=8, help="recipes searched per sparse graph")
    p.add_argument("--prior", type=Path, help="JSON of an earlier gpu_transforms / gpu_table run: its best recipes")
    p.add_argument("--db", type=Path, help="SQLite tunebank database for the transfer column")
    p.add_argument("--k", type=int, default=5, help="transfer: neighbours")
    p.add_argument("--encoder", default="static", help="transfer: static | static+profiled | learned")
    p.add_argument("--modes", default="default,max-autotune", help="torch.compile modes ('' for none)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of every family")
    p.add_argument("--only", default="", help=f"comma-separated families (dense ones, or {SPMM})")
    p.add_argument("--sizes", default="", help="comma-separated sizes (a dense case's size, a graph's label)")
    p.add_argument("--cache", type=Path, default=Path("/tmp/tunebank-bench-cache"))
    return p


def _names(text: str) -> list[str]:
    return list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    unknown = [m for m in _names(args.modes) if m not in tb.COMPILE_MODES]
    if unknown:
        p.error(f"unknown --modes {unknown}; choose from {', '.join(tb.COMPILE_MODES)}")
    return args


def selected(args: argparse.Namespace) -> tuple[list[Case], list[SpmmCase]]:
    """The dense cases and sparse graphs that --only and --sizes keep."""
    only, sizes = _names(args.only), _names(args.sizes)
    dense = [c for c in cases(args.quick) if c.family != SPMM and (not only or c.family in only)
             and (not sizes or c.size in sizes)]
    sparse = [g for g in spmm_cases(args.quick) if (not only or SPMM in only) and (not sizes or g.label in sizes)]
    return dense, sparse


def prior_recipes(path: Path | None) -> dict[tuple[str, str], str]:
    """(family, size) -> best recipe of an earlier run's JSON."""
    if path is None:
        return {}
    rows = json.loads(path.read_text())["rows"]
    best = {(r["family"], r["size"]): r.get("best_recipe") or r.get("tunebank", {}).get("best_recipe") for r in rows}
    return {key: recipe for key, recipe in best.items() if recipe}


def with_new_knobs(recipe: str, space: RecipeSpace) -> list[str]:
    """``recipe`` and its copies with each value of every knob of ``space`` it does not set (one added after it was
    found: ``RecipeSpace.unset_knobs``)."""
    stored = parse(recipe)
    return [recipe, *(str(v) for v in space.variants(stored, space.unset_knobs(stored)))]


def tune(task: Task, evaluate: Evaluate, *, budget: int, exhaustive_up_to: int = 0, seeds: Sequence[str] = (),
         backend: str = "cuda") -> dict[str, Any]:
    """The default recipe, then (see the module docstring) a random, exhaustive or seeded local search."""
    space = RecipeSpace(task.program, backend)
    default = default_recipe(task.program, backend)
    (first,) = evaluate([default])
    given = list(dict.fromkeys(r for r in (space.legal(parse(s)) for s in seeds) if r != default))
    if given:
        strategy, name = create("given_candidates", space, candidates=given, local_budget=budget, seed=0), "seeded"
    else:
        name = "exhaustive" if space.size() <= exhaustive_up_to else "random"
        strategy = create(name, space, budget=space.size() if name == "exhaustive" else budget, seed=0)
    strategy.tell([(default, first)])
    started = time.perf_counter()
    best = search(strategy, evaluate)
    failed = [r for _, r in strategy.history if not r.ok]
    return {
        "default_recipe": str(default), "default_s": first.score, "strategy": name, "seeds": len(given),
        "space_size": space.size(), "evaluated": len(strategy.history), "failed": len(failed),
        "first_error": failed[0].error[:300] if failed else "", "search_s": time.perf_counter() - started,
        "best_recipe": str(best[0]) if best else None, "best_s": best[1].score if best else math.inf,
        "best_rel_err": best[1].max_rel_err if best else None,
    }


def transfer(graph: Graph, *, database: Any, measurer: Any, index_dir: Path, k: int, encoder: str,
             backend: str = "cuda") -> dict[str, Any]:
    """``tunebank tune --strategy transfer`` on ``graph``: wall time and, summed over its subgraphs, the
    winners' times; or the error that stopped it."""
    from service.tune_transfer import transfer_model

    started = time.perf_counter()
    try:
        found = transfer_model(database, graph, measurer, backend=backend, index_dir=index_dir, encoder=encoder, k=k)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return {"wall_s": time.perf_counter() - started, "subgraphs": len(found),
            "s": sum(f.result.winner_s for f in found), "evaluations": sum(f.result.evaluations for f in found),
            "winners": [f.result.winner for f in found],
            "tried": [[[t.origin, t.recipe, t.result.median_s if t.result.ok else t.result.error_kind, t.result.repeats]
                       for t in f.result.tried] for f in found],
            "neighbours": [[n.structural_hash[:12] for n in f.result.neighbours] for f in found]}


@dataclass
class Bench:
    """What every case is measured with."""

    args: argparse.Namespace
    worker: Worker
    bandwidth: float
    rate: float
    prior: dict[tuple[str, str], str]
    database: Any = None
    measurer: Any = None

    def evaluate(self, task: Task) -> Evaluate:
        return evaluator(task, backend="cuda", cache_dir=self.args.cache, worker=self.worker,
                         repeats=self.args.repeats, timeout_s=120)


def dense_row(case: Case, bench: Bench) -> dict[str, Any]:
    args = bench.args
    task = make_task(case.graph)
    inputs = quantized_inputs(task.graph, task.program)
    row: dict[str, Any] = {"family": case.family, "size": case.size, "bytes": case.bytes, "flops": case.flops,
                           "bound_s": max(case.bytes / bench.bandwidth, case.flops / bench.rate)}
    row["eager"] = tb.eager(case.graph, inputs, args.repeats)
    for mode in _names(args.modes):
        row[f"compile {mode}"] = tb.compiled(case.graph, inputs, mode, args.repeats)
    prior = bench.prior.get((case.family, case.size))
    seeds = with_new_knobs(prior, RecipeSpace(task.program, "cuda")) if prior else []
    row["tunebank"] = tune(task, bench.evaluate(task), budget=args.budget, exhaustive_up_to=args.exhaustive_up_to,
                           seeds=seeds)
    if bench.database is None:
        row["transfer"] = {"error": "no --db given"}
    else:
        row["transfer"] = transfer(case.graph, database=bench.database, measurer=bench.measurer,
                                   index_dir=args.cache / "index", k=args.k, encoder=args.encoder)
        row["head_to_head"] = head_to_head(task, bench.evaluate(task), row["tunebank"], row["transfer"])
    return row


def head_to_head(task: Task, evaluate: Evaluate, tuned: dict[str, Any], transferred: dict[str, Any],
                 rounds: int = 3) -> dict[str, Any]:
    """The tuned best and the transfer winner timed again in one call, alternating ``rounds`` times (medians):
    a 5-13 us kernel measured in two calls differs by up to 13%, as much as the 5% the comparison is about."""
    winners = transferred.get("winners") or []
    if tuned.get("best_recipe") is None or len(winners) != 1:
        return {"error": "needs one tuned best and one transfer winner"}
    pair = [parse(tuned["best_recipe"]), parse(winners[0])]
    results = evaluate(pair * rounds)
    times = [[r.median_s for r in results[k::2] if r.ok] for k in range(2)]
    if not all(times):
        return {"error": next(r.error for r in results if not r.ok)[:200]}
    return {"tuned_s": statistics.median(times[0]), "transfer_s": statistics.median(times[1]),
            "same_recipe": pair[0] == pair[1]}


def spmm_row(graph: SpmmCase, bench: Bench, seeds: Sequence[str]) -> dict[str, Any]:
    args = bench.args
    started = time.perf_counter()
    csr = graph.make()
    task, inputs = spmm_task(csr, graph.feats)
    prepared = time.perf_counter() - started
    ref = next(iter(task.problem.reference.values()))
    n, f = csr.n, graph.feats
    bytes_ = 4 * (n + 1) + 8 * csr.nnz + 2 * 4 * n * f  # CSR once, each dense row once, output once
    row: dict[str, Any] = {"family": SPMM, "size": graph.label, **csr.stats(), "feats": f, "bytes": bytes_,
                           "bound_s": bytes_ / bench.bandwidth, "prepare_s": prepared}
    row["eager"] = tb.eager(task.graph, inputs, args.repeats)
    row.update(tb.spmm_libraries(inputs, ref, args.repeats))
    prior = bench.prior.get((SPMM, graph.label))
    row["tunebank"] = tune(task, bench.evaluate(task), budget=args.spmm_budget, seeds=[*([prior] if prior else []),
                                                                                        *seeds])
    return row


def _meta(args: argparse.Namespace, bandwidth: float, rate: float, inductor_startup_s: float) -> dict[str, Any]:
    import cupy
    import torch
    import triton

    props = torch.cuda.get_device_properties(0)
    return {
        "device": props.name, "l2_mb": props.L2_cache_size / 1e6,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__, "cupy": cupy.__version__, "triton": triton.__version__,
        "copy_tbps": bandwidth / 1e12, "matmul_tflops": rate / 1e12, "inductor_startup_s": inductor_startup_s,
        "args": {k: str(v) for k, v in vars(args).items()},
    }


def _open_transfer(args: argparse.Namespace, worker: Worker) -> tuple[Any, Any]:
    from db.session import Database
    from tunebank.cli.tune import transfer_measurer

    return Database(f"sqlite:///{args.db}"), transfer_measurer("cuda", args.cache, worker)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    cold = Path(tempfile.mkdtemp(prefix="tunebank-inductor-"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"], os.environ["TRITON_CACHE_DIR"] = str(cold / "inductor"), str(cold / "triton")
    import torch

    dense, sparse = selected(args)
    bandwidth, rate = copy_bandwidth(), matmul_rate()
    startup = tb.warm_up_compiler() if dense and args.modes else 0.0
    meta = _meta(args, bandwidth, rate, startup)
    print(json.dumps(meta), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / ("gpu_table_quick" if args.quick else "gpu_table")
    rows: list[dict[str, Any]] = []
    with Worker() as worker:
        bench = Bench(args, worker, bandwidth, rate, prior_recipes(args.prior))
        if args.db and dense:
            bench.database, bench.measurer = _open_transfer(args, worker)
        seeds: list[str] = []
        jobs = [(SPMM, g.label, lambda g=g: spmm_row(g, bench, seeds)) for g in sparse]
        jobs += [(c.family, c.size, lambda c=c: dense_row(c, bench)) for c in dense]
        for family, size, job in jobs:
            try:
                row = job()
            except Exception as e:  # one case's failure is a row, not the end of the table
                row = {"family": family, "size": size, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            if family == SPMM and row.get("tunebank", {}).get("best_recipe"):
                seeds.append(row["tunebank"]["best_recipe"])
            rows.append(row)
            torch.cuda.empty_cache()
            print(json.dumps(row, default=str), flush=True)
            stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
            stem.with_suffix(".md").write_text(markdown(meta, rows))
    print(markdown(meta, rows))


if __name__ == "__main__":
    main()
