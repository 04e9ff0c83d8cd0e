"""``tunebank tune MODEL_OR_SUBGRAPH``: search recipes for every subgraph of a model and report the speedups;
``--strategy transfer`` takes them from the nearest neighbours in the local database instead."""

import json
import math
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from db.errors import DbError
from db.session import Database
from embed.errors import EmbedError
from embed.importers import load_model
from embed.ir import Graph, graph_from_json
from embed.registry import UnknownNameError
from service.measure import MeasurementTable, Measurer, live_measurer
from service.tune_transfer import transfer_model
from transforms.backends import BackendUnavailableError, resolve_backend
from transforms.run import Worker
from transforms.search import strategies
from transforms.tune import Task, tune
from tunebank.cli.errors import fail
from tunebank.settings import Settings

console = Console(width=None if Console().is_terminal else 200)


def _load(spec: str) -> Graph:
    """A zoo model name, ``zoo:NAME``, an ``.onnx`` file or an IR ``.json`` file (a model or one subgraph)."""
    if spec.lower().endswith(".json"):
        return graph_from_json(Path(spec).read_text())
    return load_model(spec if spec.startswith("zoo:") or spec.lower().endswith(".onnx") else f"zoo:{spec}")


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}" if math.isfinite(seconds) else "-"


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
) -> None:
    """Tune every distinct subgraph of MODEL: default recipe, best recipe found, speedups."""
    if strategy != "transfer" and (strategy not in strategies.names() or strategy == "given_candidates"):
        fail(f"unknown strategy {strategy!r}; choose one of: exhaustive, random, evolutionary, transfer")
    try:
        backend = resolve_backend(backend)
    except (ValueError, BackendUnavailableError) as e:
        fail(str(e))
    cache_dir = Settings().data_dir / "kernels"
    try:
        graph = _load(model)
    except (EmbedError, OSError, ValueError) as e:
        fail(str(e).splitlines()[0])
    if strategy == "transfer":
        _transfer(model, graph, backend=backend, cache_dir=cache_dir, encoder=encoder, k=k,
                  local_budget=local_budget, per_neighbour=per_neighbour, fill=fill, seed=seed, as_json=as_json)
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=as_json) as bar:
        ids: dict[str, int] = {}

        def progress(task: Task, done: int, total: int) -> None:
            if task.name not in ids:
                ids[task.name] = bar.add_task(task.name[:60], total=total)
            bar.update(ids[task.name], completed=min(done, total))

        try:
            results = tune(graph, strategy=strategy, backend=backend, budget=budget, cache_dir=cache_dir, seed=seed,
                           progress=progress, reorder=reorder)
        except (EmbedError, UnknownNameError, ValueError) as e:
            fail(str(e).splitlines()[0])
    if as_json:
        rows = [{**r.__dict__, "speedup": r.speedup, "speedup_vs_eager": r.speedup_vs_eager} for r in results]
        orders = [{**o.__dict__, "winner": o.winner} for o in results.orders]
        console.print_json(json.dumps({"subgraphs": rows, "orders": orders} if reorder else rows,
                                      default=lambda v: None))
        return
    table = Table(title=f"{model}: {len(results)} subgraphs, {strategy}, budget {budget}, {backend}")
    for column in ("subgraph", "kind", "space", "eager us", "default us", "best us", "x default", "x eager",
                   "tried", "failed", "best recipe"):
        table.add_column(column, overflow="fold")
    for r in results:
        table.add_row(r.name, r.kind, str(r.space_size), _us(r.eager_s), _us(r.default_s), _us(r.best_s),
                      f"{r.speedup:.2f}", f"{r.speedup_vs_eager:.2f}", str(r.evaluated), str(r.failed),
                      r.best_recipe or "-")
    console.print(table)
    if results.orders:
        orders = Table(title="chain orders (sum of the subgraphs' best times)")
        for column in ("chain", "A·(X·W) us", "(A·X)·W us", "winner"):
            orders.add_column(column)
        for o in results.orders:
            orders.add_row(o.chain, _us(o.original_s), _us(o.reordered_s), o.winner)
        console.print(orders)


def transfer_measurer(backend: str, cache_dir: Path, worker: Worker) -> Measurer:
    """Live measurements on this machine's ``backend`` device (peaks measured once per run)."""
    from service.devices import detect_device
    from tunebank.cli.bench import toolchain

    return live_measurer(MeasurementTable(detect_device(backend), toolchain(backend)), backend=backend,
                         cache_dir=cache_dir, worker=worker)


def _transfer(model: str, graph: Graph, *, backend: str, cache_dir: Path, encoder: str, k: int, local_budget: int,
              per_neighbour: int, fill: bool, seed: int, as_json: bool) -> None:
    settings = Settings()
    database = Database(settings.resolved_database_url)
    try:
        with Worker() as worker:
            measurer = transfer_measurer(backend, cache_dir, worker)
            results = transfer_model(database, graph, measurer, backend=backend, index_dir=settings.index_dir,
                                     encoder=encoder, k=k, local_budget=local_budget, per_neighbour=per_neighbour,
                                     fill=fill, seed=seed)
    except (DbError, EmbedError, UnknownNameError, LookupError, ValueError) as e:
        fail(str(e).splitlines()[0])
    finally:
        database.dispose()
    if as_json:
        rows = [{"subgraph": r.name, "kind": r.kind, "structural_hash": r.structural_hash,
                 "default_s": r.result.default_s, "winner_s": r.result.winner_s, "speedup": r.result.speedup,
                 "winner": r.result.winner, "evaluations": r.result.evaluations,
                 "neighbours": [{"structural_hash": n.structural_hash, "distance": n.distance, "recipe": n.recipe,
                                 "changes": list(n.changes)} for n in r.result.neighbours]} for r in results]
        console.print_json(json.dumps(rows, default=lambda v: None))
        return
    table = Table(title=f"{model}: {len(results)} subgraphs, transfer ({encoder}, k {k}, local budget {local_budget}), "
                        f"{backend}")
    for column in ("subgraph", "kind", "neighbours (distance)", "default us", "best us", "x default", "tried",
                   "winner (validated)"):
        table.add_column(column, overflow="fold")
    for r in results:
        near = ", ".join(f"{n.structural_hash[:8]} ({n.distance:.2f})" for n in r.result.neighbours) or "none"
        table.add_row(r.name, r.kind, near, _us(r.result.default_s), _us(r.result.winner_s),
                      f"{r.result.speedup:.2f}", str(r.result.evaluations), r.result.winner)
    console.print(table)
