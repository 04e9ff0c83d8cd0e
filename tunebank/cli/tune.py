"""``tunebank tune MODEL_OR_SUBGRAPH``: search recipes for every subgraph of a model and report the speedups;
``--strategy transfer`` takes them from the nearest neighbours in the local database instead."""

import math
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from db.errors import DbError
from db.session import Database
from embed.errors import EmbedError
from embed.ir import Graph
from embed.partition import partition
from embed.registry import UnknownNameError
from service.measure import MeasurementTable, Measurer
from service.measurement_store import MeasurementStore
from service.strict_json import strict_json
from service.tune_transfer import transfer_model
from transforms.backends import BackendUnavailableError, resolve_backend
from transforms.reorder import chain_orders
from transforms.run import Worker
from transforms.search import strategies
from transforms.tune import Task, eager_seconds, evaluator, tune
from tunebank.cli.common import data_folder, load_graph, open_database, problem_bytes, settings
from tunebank.cli.errors import fail, warn
from tunebank.cli.text import plain, printable, stdout_console
from tunebank.settings import Settings

console = stdout_console()

CpuThreads = Annotated[int, typer.Option(min=0, help="OpenMP threads for cpu kernels (0: leave OMP_NUM_THREADS as is)")]
Timeout = Annotated[float, typer.Option("--timeout", min=0.1, help="seconds each candidate may take to validate and "
                                                                   "time before its worker is killed")]


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}" if math.isfinite(seconds) else "-"


def print_json(value: Any) -> None:
    typer.echo(strict_json(value))


def pin_cpu_threads(threads: int | None) -> str:
    """Pin OpenMP threads of the kernel workers started from now on. Unpinned on a machine that is busy before we
    start, the warning to give once something was timed (else "")."""
    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)  # read by the worker processes
        return ""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if threads is not None and load > 0.75 * cores and not os.environ.get("OMP_NUM_THREADS"):
        return (f"the machine was busy (load {load:.1f} on {cores} cores): OpenMP timings may be noisy; "
                "pass --cpu-threads N")
    return ""


def check_problem_sizes(graph: Graph, config: Settings) -> None:
    """Refuse, before anything is allocated or generated, a model with a subgraph whose tuning problem would not fit
    TUNEBANK_MAX_PROBLEM_BYTES, or that fuses more than TUNEBANK_MAX_KERNEL_NODES nodes."""
    try:
        subgraphs = partition(graph)
    except EmbedError as e:
        fail(str(e))
    for sub in subgraphs:
        if sub.tunable and len(sub.graph.nodes) > config.max_kernel_nodes:
            fail(f"subgraph {sub.structural_hash[:8]} ({sub.kind.value}) fuses {len(sub.graph.nodes)} nodes, over the "
                 f"limit of {config.max_kernel_nodes} (TUNEBANK_MAX_KERNEL_NODES)")
        size = problem_bytes(sub.graph)
        if sub.tunable and size > config.max_problem_bytes:
            fail(f"subgraph {sub.structural_hash[:8]} ({sub.kind.value}) needs about {size} bytes to validate, over "
                 f"the limit of {config.max_problem_bytes} (TUNEBANK_MAX_PROBLEM_BYTES)")


def tune_command(
    model: Annotated[str, typer.Argument(help="zoo model name, .onnx file, or IR .json (model or subgraph)")],
    strategy: Annotated[str, typer.Option(help="exhaustive | random | evolutionary | transfer")] = "random",
    budget: Annotated[int, typer.Option(min=1, max=100_000, help="recipes to try per subgraph")] = 32,
    backend: Annotated[str, typer.Option(help="auto | cpu | cuda (auto: cuda when CuPy sees a GPU)")] = "auto",
    seed: Annotated[int, typer.Option(help="random seed (inputs and search)")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the results as JSON")] = False,
    reorder: Annotated[bool, typer.Option("--reorder", help="also tune (A·X)·W for each A·(X·W) chain")] = False,
    k: Annotated[int, typer.Option("--k", min=1, help="transfer: neighbours whose best recipes are tried")] = 5,
    local_budget: Annotated[int, typer.Option(min=0, help="transfer: local-search recipes after the neighbours")] = 0,
    per_neighbour: Annotated[int, typer.Option(min=1, help="transfer: recipes each neighbour gives (its fastest)")] = 1,
    fill: Annotated[bool, typer.Option(help="transfer: fill the places the neighbours leave of k x per-neighbour: "
                                            "their variants, vendor-ranked recipes, random ones")] = True,
    encoder: Annotated[str, typer.Option(help="transfer: static | static+profiled | learned")] = "static",
    cpu_threads: CpuThreads = 0,
    timeout: Timeout = 30.0,
    store: Annotated[bool, typer.Option("--store/--no-store", help="keep what is measured in the database (as a "
                                                                   "crawl would: optimize then hits it)")] = True,
) -> None:
    """Tune every distinct subgraph of MODEL: default recipe, best recipe found, speedups.

    Exit codes: 0 when something was measured, 1 when every candidate failed, 2 for bad input or settings."""
    if strategy != "transfer" and (strategy not in strategies.names() or strategy == "given_candidates"):
        fail(f"unknown strategy {strategy!r}; choose one of: exhaustive, random, evolutionary, transfer")
    config = settings()
    try:
        backend = resolve_backend(backend)
    except (ValueError, BackendUnavailableError) as e:
        fail(str(e))
    graph = load_graph(model, config)
    check_problem_sizes(graph, config)
    threads = cpu_threads if backend == "cpu" else None
    if strategy == "transfer":
        _transfer(model, graph, config, backend=backend, encoder=encoder, k=k,
                  local_budget=local_budget, per_neighbour=per_neighbour, fill=fill, seed=seed, as_json=as_json,
                  timeout_s=timeout, cpu_threads=threads)
        return
    cache_dir = data_folder(config, "kernels")
    busy = pin_cpu_threads(threads)
    database, recorder = _store(config, graph, backend, reorder) if store else (None, None)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=as_json) as bar:
        ids: dict[str, int] = {}

        def progress(task: Task, done: int, total: int) -> None:
            if task.name not in ids:
                ids[task.name] = bar.add_task(escape(printable(task.name, 60)), total=total)
            bar.update(ids[task.name], completed=min(done, total))

        try:
            results = tune(graph, strategy=strategy, backend=backend, budget=budget, cache_dir=cache_dir, seed=seed,
                           progress=progress, reorder=reorder, timeout_s=timeout, recorder=recorder)
        except (EmbedError, UnknownNameError, ValueError) as e:
            fail(str(e).splitlines()[0])
        except MemoryError:
            fail(f"out of memory tuning {model!r}: lower TUNEBANK_MAX_PROBLEM_BYTES or tune a smaller model")
    if database is not None:
        database.dispose()
    if as_json:
        rows = [{**r.__dict__, "speedup": r.speedup, "speedup_vs_eager": r.speedup_vs_eager} for r in results]
        orders = [{**o.__dict__, "winner": o.winner} for o in results.orders]
        print_json({"subgraphs": rows, "orders": orders} if reorder else rows)
    else:
        _print_results(model, results, strategy=strategy, budget=budget, backend=backend)
        if recorder is not None:
            where = "TUNEBANK_DATABASE_URL" if config.database_url else str(config.data_dir / "tunebank.db")
            console.print(plain(f"stored {recorder.stored} new measurements in {where} (--no-store: keep none)"))
    _exit_when_nothing_measured([r.best_s for r in results], sum(r.evaluated for r in results),
                                "" if as_json else busy)


def _store(config: Settings, graph: Graph, backend: str, reorder: bool) -> tuple[Database, MeasurementStore]:
    """The settings' database (created or upgraded: tune writes) and a recorder storing into it."""
    from db.migrate import upgrade
    from service.devices import detect_device, toolchain

    database = open_database(config, create=True)
    try:
        upgrade(database.engine)
    except Exception as e:  # noqa: BLE001 (a database it cannot migrate: one line)
        fail(f"cannot prepare the database for storing: {str(e).splitlines()[0] if str(e) else type(e).__name__} "
             "(pass --no-store to tune without it)")
    try:
        subgraphs = [s for g in (chain_orders(graph) if reorder else [graph]) for s in partition(g)]
        return database, MeasurementStore(database, detect_device(backend), toolchain(backend), subgraphs)
    except EmbedError as e:  # a subgraph that cannot be lowered (its features are stored with it)
        fail(str(e).splitlines()[0])


def _exit_when_nothing_measured(best: list[float], tried: int, busy: str = "") -> None:
    """Exit 1 when every candidate failed; else the one warning there is (nothing to tune, or a busy machine)."""
    if best and not any(math.isfinite(s) for s in best):
        fail(f"nothing could be measured: all {tried} candidates of {len(best)} subgraphs failed", code=1)
    if not best:
        warn("the model has no tunable subgraph: nothing to tune")
    elif busy:
        warn(busy)


def _print_results(model: str, results: Any, *, strategy: str, budget: int, backend: str) -> None:
    title = f"{model}: {len(results)} subgraphs, {strategy}, budget {budget}, {backend}; times in us"
    table = Table(title=plain(title))
    table.add_column("subgraph", overflow="fold")
    for column in ("eager", "default", "best", "x def", "x eager", "tried", "fail"):
        table.add_column(column, justify="right", no_wrap=True)
    for r in results:
        table.add_row(plain(_short(r.name, model)), _us(r.eager_s), _us(r.default_s), _us(r.best_s),
                      f"{r.speedup:.2f}", f"{r.speedup_vs_eager:.2f}", str(r.evaluated), str(r.failed))
    console.print(table)
    if results:
        console.print(plain("best recipes (recipe space size):"))
    for r in results:
        console.print(plain(f"  {r.name}: {r.best_recipe or '-'} ({r.space_size})", 10**4), soft_wrap=True)
    if results.orders:
        orders = Table(title="chain orders (sum of the subgraphs' best times)")
        for column in ("chain", "A·(X·W) us", "(A·X)·W us", "winner"):
            orders.add_column(column, overflow="fold")
        for o in results.orders:
            orders.add_row(plain(o.chain), _us(o.original_s), _us(o.reordered_s), o.winner)
        console.print(orders)


def _short(name: str, model: str) -> str:
    """``gpt_decoder#3 (matmul+add)`` as ``#3 matmul+add`` (the model is in the title)."""
    head, sep, rest = name.partition("#")
    return f"#{rest.replace(' (', ' ', 1).removesuffix(')')}" if sep and head and head in model else name


def transfer_measurer(backend: str, cache_dir: Path, worker: Worker, *, timeout_s: float = 30.0,
                      repeats: int = 10) -> Measurer:
    """Live measurements on this machine's ``backend`` device (peaks measured once per run), each candidate bounded
    by ``timeout_s``."""
    from service.devices import detect_device
    from tunebank.cli.bench import toolchain

    def run(task: Task, recipes: list[Any]) -> list[Any]:
        return evaluator(task, backend=backend, cache_dir=cache_dir, worker=worker, repeats=repeats,
                         timeout_s=timeout_s)(recipes)

    return Measurer(MeasurementTable(detect_device(backend), toolchain(backend)), run=run,
                    eager_time=lambda task: eager_seconds(task, repeats=repeats, backend=backend))


def _transfer(model: str, graph: Graph, config: Settings, *, backend: str, encoder: str, k: int,
              local_budget: int, per_neighbour: int, fill: bool, seed: int, as_json: bool, timeout_s: float,
              cpu_threads: int | None) -> None:
    database = open_database(config)
    cache_dir = data_folder(config, "kernels")
    busy = pin_cpu_threads(cpu_threads)
    try:
        with Worker() as worker:
            measurer = transfer_measurer(backend, cache_dir, worker, timeout_s=timeout_s)
            results = transfer_model(database, graph, measurer, backend=backend, index_dir=config.index_dir,
                                     encoder=encoder, k=k, local_budget=local_budget, per_neighbour=per_neighbour,
                                     fill=fill, seed=seed)
    except (DbError, EmbedError, UnknownNameError, LookupError, ValueError) as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except OSError as e:
        fail(f"TUNEBANK_DATA_DIR={str(config.data_dir)!r}: {e.strerror or e}: {e.filename or ''} (index files are "
             "rebuilt from the database when removed)")
    except MemoryError:
        fail(f"out of memory tuning {model!r}: lower TUNEBANK_MAX_PROBLEM_BYTES or tune a smaller model")
    finally:
        database.dispose()
    if as_json:
        rows = [{"subgraph": r.name, "kind": r.kind, "structural_hash": r.structural_hash,
                 "default_s": r.result.default_s, "winner_s": r.result.winner_s, "speedup": r.result.speedup,
                 "winner": r.result.winner, "evaluations": r.result.evaluations,
                 "neighbours": [{"structural_hash": n.structural_hash, "distance": n.distance, "recipe": n.recipe,
                                 "changes": list(n.changes)} for n in r.result.neighbours]} for r in results]
        print_json(rows)
        _exit_when_nothing_measured([r.result.winner_s for r in results], sum(r.result.evaluations for r in results))
        return
    table = Table(title=plain(f"{model}: {len(results)} subgraphs, transfer ({encoder}, k {k}, local budget "
                              f"{local_budget}), {backend}"))
    for column in ("subgraph", "kind", "neighbours (distance)", "default us", "best us", "x default", "tried",
                   "winner (validated)"):
        table.add_column(column, overflow="fold")
    for r in results:
        near = ", ".join(f"{n.structural_hash[:8]} ({n.distance:.2f})" for n in r.result.neighbours) or "none"
        table.add_row(plain(r.name), r.kind, near, _us(r.result.default_s), _us(r.result.winner_s),
                      f"{r.result.speedup:.2f}", str(r.result.evaluations), plain(r.result.winner, 10**4))
    console.print(table)
    _exit_when_nothing_measured([r.result.winner_s for r in results], sum(r.result.evaluations for r in results), busy)
