"""``tunebank optimize MODEL``: a plan for the whole model (hits, transfers, eager fallbacks), its report, and with
``--out`` the plan file that ``tunebank.load`` runs. With ``--server URL`` the model goes to a ``tunebank serve`` there
(through ``tunebank.Client``) and the same report comes back."""

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from db.errors import DbError
from embed.errors import EmbedError
from embed.registry import UnknownNameError
from service.optimize import OptimizeReport
from service.strict_json import strict_json
from transforms.backends import BackendUnavailableError
from transforms.plan import PlanError
from transforms.run import SLOWER_FACTOR
from tunebank.cli.common import data_folder, load_graph, model_spec, open_database, settings
from tunebank.cli.errors import fail
from tunebank.cli.tune import CpuThreads, check_problem_sizes, pin_cpu_threads
from tunebank.client import ApiError, Client
from tunebank.reports import Report

console = Console(highlight=False)


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.1f}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def optimize_command(
    model: Annotated[str, typer.Argument(help="zoo model name, .onnx file, or IR .json")],
    out: Annotated[Path | None, typer.Option("--out", help="write the plan file (.tbplan) here")] = None,
    backend: Annotated[str, typer.Option(help="auto | cpu | cuda (auto: cuda when CuPy sees a GPU)")] = "auto",
    k: Annotated[int, typer.Option("--k", min=1, max=64, help="neighbours whose recipes are tried per subgraph")] = 5,
    margin: Annotated[float, typer.Option(min=0.0, max=10.0, help="how much faster than eager a kernel must be "
                                                                 "to be chosen (0.05: 5%)")] = 0.05,
    time_model: Annotated[bool, typer.Option("--time/--no-time", help="time the whole plan against eager")] = True,
    seed: Annotated[int, typer.Option(help="random seed (inputs and fill)")] = 0,
    cpu_threads: CpuThreads = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    server: Annotated[str | None, typer.Option(
        "--server", help="optimize on a tunebank serve at this URL (e.g. http://127.0.0.1:8000), not here")] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="TUNEBANK_API_KEY", show_envvar=True,
        help="with --server: an API key with the optimize scope (tunebank keys create)")] = None,
    device_class: Annotated[str | None, typer.Option(
        "--device-class", help="with --server: the device class to tune for (default: the server's own)")] = None,
) -> None:
    """Optimize MODEL into a plan: per distinct subgraph a stored hit, a transfer from the nearest tuned
    neighbours, or eager PyTorch when nothing beats it; then the whole model timed against eager."""
    if server is not None:
        local_only = {"--backend": backend != "auto", "--no-time": not time_model, "--seed": seed != 0,
                      "--cpu-threads": bool(cpu_threads)}
        given = [name for name, set_ in local_only.items() if set_]
        if given:
            fail(f"{given[0]} applies to optimizing here, not with --server (the server uses its own backend: "
                 "tunebank serve --backend)")
        _optimize_remote(model, server, api_key, out=out, k=k, margin=margin, device_class=device_class,
                         as_json=as_json)
        return
    if device_class is not None:
        fail("--device-class needs --server (here the device is this machine's: --backend)")
    from service.weights import model_weights
    from tunebank import api

    config = settings()
    graph = load_graph(model, config)
    check_problem_sizes(graph, config)
    data_folder(config, "kernels")
    open_database(config, create=True).dispose()  # a bad URL, server or file: one line naming the setting
    if cpu_threads:  # the kernels' OpenMP threads, and eager PyTorch's, which it is timed against
        import torch

        torch.set_num_threads(cpu_threads)
    busy = pin_cpu_threads(cpu_threads)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True, disable=as_json) as bar:
        task = bar.add_task("importing", total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=escape(what))

        try:
            result = api.optimize(graph, params=model_weights(model_spec(model), graph), backend=backend, k=k,
                                  margin=margin, time_model=time_model, seed=seed, progress=progress, settings=config)
            saved = api.save(result, out) if out is not None else None
        except (EmbedError, DbError, PlanError, UnknownNameError, LookupError, BackendUnavailableError,
                ValueError, OSError) as e:
            fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    if as_json:
        sys.stdout.write(strict_json({**result.report.to_json(), "plan": str(saved) if saved else None}) + "\n")
        return
    _print(result.report)
    if busy:
        console.print(f"warning: {busy}")
    if saved is not None:
        plan = result.plan
        fused = f"{plan.attentions} fused attentions, " if plan.attentions else ""
        console.print(f"plan: {escape(str(saved))} ({plan.kernels} kernels, {fused}"
                      f"{len(plan.steps) - plan.tuned} eager or folded steps)")


def _optimize_remote(model: str, server: str, api_key: str | None, *, out: Path | None, k: int, margin: float,
                     device_class: str | None, as_json: bool) -> None:
    """``optimize --server``: send MODEL through ``tunebank.Client``, wait with a progress bar, print its report."""
    if not server.startswith(("http://", "https://")):
        fail(f"--server {server!r}: give the URL of a tunebank serve, e.g. http://127.0.0.1:8000")
    try:
        with Client(server, api_key, retries=2, progress=not as_json) as client:
            job = client.optimize(model, k=k, margin=margin, device_class=device_class)
            if job.status != "succeeded":
                fail(f"job {job.id} on {server} {job.status}: {job.error or 'no reason given'}")
            saved = client.download_plan(job.id, out) if out is not None else None
    except ApiError as e:
        fail(_api_message(e, server, api_key))
    except (OSError, ValueError, LookupError, EmbedError, PlanError) as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    report = job.report
    if as_json:
        data = report.to_json() if report is not None else {}
        sys.stdout.write(strict_json({**data, "job": job.id, "server": server,
                                      "plan": str(saved) if saved else None}) + "\n")
        return
    if report is not None:
        _print(report)
    console.print(f"job {job.id} on {escape(server)}")
    if saved is not None:
        kernels = sum(s.choice == "kernel" for s in report.subgraphs) if report is not None else 0
        console.print(f"plan: {escape(str(saved))} ({kernels} kernel subgraphs)")


def _api_message(e: ApiError, server: str, api_key: str | None) -> str:
    if e.status == 0:
        return f"cannot reach {server}: is `tunebank serve` running there? ({e.detail})"
    if e.status == 401 and api_key is None:
        return (f"{server} needs an API key: pass --api-key KEY or set TUNEBANK_API_KEY (`tunebank keys create "
                "--scopes read,optimize` on the server makes one)")
    if e.status == 401:
        return f"{server} refused the API key (unknown or revoked): {e.detail}"
    if e.status == 403:
        return f"{server}: {e.detail} (this command needs a key with the read and optimize scopes)"
    if e.status == 413:
        return f"{server}: the model is too large for this server: {e.detail}"
    return f"{server}: {e.status} {e.error}: {e.detail}"


def _print(report: OptimizeReport | Report) -> None:
    table = Table(title=escape(f"{report.model}: {len(report.subgraphs)} distinct subgraphs on {report.device}"),
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    widths = {"#": 2, "source": 9, "near": 5, "tried": 5, "runs": 6, "us": 8, "eager us": 8, "x": 6}
    for column in ("#", "ops", "source", "near", "tried", "runs", "us", "eager us", "x"):
        table.add_column(column, no_wrap=True, overflow="ellipsis", min_width=widths.get(column, 12),
                         max_width=16 if column == "ops" else None, justify="left" if column == "ops" else "right")
    for n, s in enumerate(report.subgraphs):
        nearest = min((x["distance"] for x in s.neighbours), default=None)
        near = f"{nearest:.2f}" if nearest is not None else "-"
        failed = sum(c["error"] not in (None, "slow") for c in s.candidates)
        skipped = sum(c["error"] == "slow" for c in s.candidates)
        tried = f"{len(s.candidates) - skipped}" + (f"/{failed}x" if failed else "")
        tried += f"+{skipped}" if skipped else ""
        chosen = s.kernel_s if s.choice == "kernel" else s.eager_s
        source = "untunable" if s.source == "not tunable" else s.source + ("*" if s.queued else "")
        ops = "+".join(s.ops) + (f" x{s.occurrences}" if s.occurrences > 1 else "")
        table.add_row(str(n), escape(ops), source, near, tried, s.choice, _us(chosen),
                      _us(s.eager_s), f"{s.speedup:.2f}" if s.speedup else "-")
    console.print(table)
    console.print("near: nearest neighbour's distance; tried: candidates run/failed(+not run: their launch could "
                  f"not come within {SLOWER_FACTOR:g}x of the fastest known); *: queued for the crawler")
    lenders = sorted({str(x["lent_by"]) for s in report.subgraphs for x in s.neighbours if x.get("lent_by")})
    if lenders:
        console.print(f"neighbours' recipes measured on {escape(', '.join(lenders))} (this device's class), not here: "
                      "crawl on this device for its own")
    for n, s in enumerate(report.subgraphs):
        if s.source == "not tunable":
            console.print(f"#{n} not tunable: {escape(str(s.reason))}")
        elif s.source == "transfer" and s.reason:  # fewer candidates than k, and why
            console.print(f"#{n} {escape(s.reason)}")
    counts = ", ".join(f"{v} {k}" for k, v in report.counts().items())
    console.print(f"subgraphs: {escape(counts)}; kernels measured: {report.measured}")
    if report.model_s is not None:
        line = f"whole model: plan {_ms(report.model_s)}, eager {_ms(report.eager_model_s)}"
        if report.speedup:
            line += f" ({report.speedup:.2f}x eager)"
        if report.compile_model_s is not None:
            line += f", torch.compile default {_ms(report.compile_model_s)}"
        if report.model_fallback:
            line += "; the kernels lost as a whole, so every subgraph runs eagerly"
        console.print(line)
    if len(report.ways_s) > 1:
        console.print("timed whole: " + ", ".join(f"{escape(way)} {_ms(s)}" for way, s in report.ways_s.items()))
    console.print("wall time: " + ", ".join(f"{k} {v:.2f} s" for k, v in report.stages_s.items()))
