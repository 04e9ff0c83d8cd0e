"""``tunebank bench transfer``: leave-one-model-out (or -family-out) evaluation of transfer tuning; writes markdown
and JSON.

A long live run can save its measurements as it goes (``--checkpoint``), stop before a time limit
(``--stop-after``) and be continued by another process (``--resume``), which measures only what is missing; with
``--devices N`` it measures on N GPUs at once (``tunebank.cli.bench_devices``).
"""

import json
import math
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from embed.errors import EmbedError
from embed.importers.files import read_limited
from embed.registry import UnknownNameError
from service.bench_report import report_json, report_markdown
from service.bench_transfer import BenchConfig, run_bench
from service.devices import toolchain
from service.measure import (
    Checkpoint,
    MeasurementTable,
    Measurer,
    MissingMeasurementError,
    ProvisionalReplay,
    RunStopped,
    live_measurer,
)
from tunebank.cli.bench_devices import STOPPED, measure_on_devices, write_json
from tunebank.cli.errors import fail
from tunebank.settings import Settings

app = typer.Typer(help="Benchmarks.", no_args_is_help=True)
console = Console(stderr=True, highlight=False, soft_wrap=True)

DEFAULT_MODELS = "bert_encoder-h128-s64-b1,gpt_decoder-h128-s32-b2,mixer_block-h128-s32-b1,lm_head-h128-v512-t64"


def _csv(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _recording(path: Path) -> dict[str, Any]:
    """A report or checkpoint JSON (both hold ``measurements``, and ``runs`` when made by this command)."""
    try:
        data = json.loads(read_limited(path, Settings().max_model_bytes))
        if not isinstance(data, dict) or not isinstance(data.get("runs", []), list):
            raise ValueError("expected an object with 'measurements' (and a list of 'runs')")
        MeasurementTable.from_json(data["measurements"])
    except (EmbedError, OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as e:
        fail(f"cannot read a recording from {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    return data


def _live_table(backend: str, resume: Path | None) -> tuple[MeasurementTable, list[dict[str, Any]]]:
    """A new table on this machine's device, or the resumed one (which must come from the same device and
    toolchain), with the runs that measured it."""
    from service.devices import detect_device

    device, chain = detect_device(backend), toolchain(backend)
    if resume is None:
        return MeasurementTable(device, chain), []
    data = _recording(resume)
    table = MeasurementTable.from_json(data["measurements"])
    if (table.device.name, table.device.device_class, table.toolchain) != (device.name, device.device_class, chain):
        fail(f"{resume} was measured on {table.device.name} with {table.toolchain!r}; this machine has "
             f"{device.name} with {chain!r}")
    return table, list(data.get("runs", []))


def _stopped(e: RunStopped, table: MeasurementTable, checkpoint: Path | None) -> None:
    console.print(f"{e}: {table.size} measurements saved to {checkpoint}; continue with --resume {checkpoint}",
                  markup=False)
    raise typer.Exit(code=STOPPED)


def _measure_on_devices(config: BenchConfig, table: MeasurementTable, *, stop_after_s: float,
                        save: Callable[[MeasurementTable, int], None], checkpoint: Path | None, **options: Any) -> None:
    """``measure_on_devices`` in a scratch folder, stopping or failing as the command does."""
    started = time.monotonic()

    def progress(message: str) -> None:
        console.print(f"[{time.monotonic() - started:5.0f} s] {message}", markup=False)

    with tempfile.TemporaryDirectory(prefix="tunebank-devices-") as workdir:
        try:
            measure_on_devices(config, table, workdir=Path(workdir), stop_after_s=stop_after_s or math.inf, save=save,
                               progress=progress, **options)
        except RunStopped as e:
            _stopped(e, table, checkpoint)
        except RuntimeError as e:
            fail(f"{e}; what was measured is saved to {checkpoint}" if checkpoint else str(e))
        except ValueError as e:  # more --devices than visible GPUs
            fail(str(e))


@app.command("transfer")
def transfer_command(
    models: Annotated[str, typer.Option(help="comma-separated zoo names, .onnx or IR .json files (a file's family: "
                                             "its name before the first '-')")] = DEFAULT_MODELS,
    backend: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    budget: Annotated[int, typer.Option(min=1, help="recipes searched per subgraph for the optimum")] = 32,
    k: Annotated[str, typer.Option("--k", help="neighbour counts, comma-separated")] = "1,3,5,10",
    random_k: Annotated[str, typer.Option("--random-k", help="random-baseline counts (default: --k)")] = "",
    encoders: Annotated[str, typer.Option(
        help="comma-separated encoders; 'oracle' ranks neighbours by their measured transfer (the headroom)")] = (
        "static,static+profiled,learned"),
    held_out: Annotated[str, typer.Option(help="models to hold out (default: each of --models)")] = "",
    local_budget: Annotated[int, typer.Option(min=0, help="local-search recipes after transfer")] = 0,
    per_neighbour: Annotated[int, typer.Option(min=1, help="recipes each neighbour gives (its fastest)")] = 1,
    fill: Annotated[bool, typer.Option(help="fill the places the neighbours leave of k x per-neighbour: their "
                                            "variants, vendor-ranked recipes, random ones")] = True,
    fills: Annotated[str, typer.Option(help="fills to compare, comma-separated, the first one's rows under the "
                                            "encoder's own name: none | random | model (a cost model ranks a pool); "
                                            "default: random (none with --no-fill)")] = "",
    fill_pool: Annotated[str, typer.Option(help="what the model fill ranks: space (256 random recipes) | recorded "
                                                "(the random recipes the run measures anyway: replays old "
                                                "recordings)")] = "space",
    split: Annotated[str, typer.Option(help="model: leave one model out | family: leave one zoo family out (none "
                                            "of its subgraphs in the database)")] = "model",
    optimum: Annotated[str, typer.Option(help="recorded: the fastest anything in the run measured | strong: also "
                                              "search each held-out subgraph, exhaustively under --exhaustive-below "
                                              "recipes, else --strong-budget evolutionary ones")] = "recorded",
    exhaustive_below: Annotated[int, typer.Option(min=0, help="spaces smaller than this are enumerated by "
                                                              "--optimum strong")] = 2000,
    strong_budget: Annotated[int, typer.Option(min=1, help="new recipes of the strong optimum's evolutionary "
                                                           "search on a larger space")] = 256,
    library: Annotated[bool, typer.Option(help="give every method the vendor libraries' implementations (cuDNN's "
                                               "for a convolution) beside its picks, as optimize does")] = False,
    database: Annotated[str, typer.Option(help="what a fold's database holds of each subgraph: crawl (its own "
                                               "search and the cross table, as a crawl with --budget stores them) | "
                                               "strong (also its strong optimum's search; needs --optimum strong)")
                        ] = "crawl",
    strategy: Annotated[str, typer.Option(help="search for the optimum: exhaustive | random | evolutionary")] = (
        "evolutionary"),
    repeats: Annotated[int, typer.Option(min=1, help="timed runs per kernel (median)")] = 10,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    encoder_seed: Annotated[int | None, typer.Option(
        help="seed of the learned encoder's training (default: --seed); a replay can vary it alone")] = None,
    devices: Annotated[int, typer.Option(min=1, help="measure on this many GPUs at once, one process each "
                                                   "(CUDA_VISIBLE_DEVICES), stage by stage; cpu: processes")] = 1,
    cpu_threads: Annotated[int, typer.Option(min=0, help="OpenMP threads for cpu kernels (0: leave as is)")] = 0,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="seconds each candidate may take to validate "
                                                                     "and time before its worker is killed")] = 30.0,
    replay: Annotated[Path | None, typer.Option(help="replay the measurements of an earlier JSON report")] = None,
    missing_as_failed: Annotated[bool, typer.Option(help="with --replay of a partial recording: take what it lacks "
                                                         "as failed kernels and count them (a provisional report, "
                                                         "markdown only)")] = False,
    resume: Annotated[Path | None, typer.Option(help="continue from a checkpoint (or report): measure only what "
                                                     "it lacks")] = None,
    checkpoint: Annotated[Path | None, typer.Option(help="save the measurements here as the run goes")] = None,
    checkpoint_every: Annotated[float, typer.Option(min=1, help="seconds between checkpoint saves")] = 30.0,
    stop_after: Annotated[float, typer.Option(min=0, help="stop (exit code 3) before measuring past this many "
                                                          "seconds; 0: no limit")] = 0.0,
    out: Annotated[Path, typer.Option(help="output path without suffix: writes OUT.md and OUT.json")] = Path(
        "bench/results/transfer"),
) -> None:
    """Leave-one-model-out over MODELS: transfer with each k and encoder vs the optimum, default, random, eager."""
    if backend not in ("cpu", "cuda"):
        fail(f"unknown backend {backend!r}; choose cpu or cuda")
    if replay is not None and (resume or checkpoint or stop_after):
        fail("--replay measures nothing: it takes no --resume, --checkpoint or --stop-after")
    if replay is not None and devices > 1:
        fail("--replay measures nothing: it takes no --devices")
    if missing_as_failed and replay is None:
        fail("--missing-as-failed is for --replay")
    if stop_after and checkpoint is None:
        fail("--stop-after needs --checkpoint (where the measurements are kept to resume from)")
    try:
        config = BenchConfig(models=_csv(models), backend=backend, budget=budget,
                             ks=tuple(int(v) for v in _csv(k)), random_ks=tuple(int(v) for v in _csv(random_k)) or None,
                             encoders=_csv(encoders), held_out=_csv(held_out) or None, strategy=strategy,
                             local_budget=local_budget, per_neighbour=per_neighbour, fill=fill, seed=seed,
                             encoder_seed=encoder_seed, split=split, fills=_csv(fills) or None, fill_pool=fill_pool,
                             optimum=optimum, exhaustive_below=exhaustive_below, strong_budget=strong_budget,
                             library=library, database=database)
    except (ValueError, UnknownNameError) as e:
        fail(str(e))
    if cpu_threads:
        os.environ["OMP_NUM_THREADS"] = str(cpu_threads)  # read by the kernel worker processes started below
    from transforms.run import Worker

    started = time.monotonic()
    with Worker() as worker:
        if replay is not None:
            recording = _recording(replay)
            table = MeasurementTable.from_json(recording["measurements"])
            measurer = ProvisionalReplay(table) if missing_as_failed else Measurer(table)
            runs = recording.get("runs", [])
        else:
            table, runs = _live_table(backend, resume)
            run = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                   "command": shlex.join(["tunebank", *sys.argv[1:]]), "kernels": 0}
            runs = [*runs, run]

            def save(table: MeasurementTable) -> None:
                run["kernels"] = measurer.evaluations
                if checkpoint is not None:
                    write_json(checkpoint, {"config": asdict(config), "runs": runs, "measurements": table.to_json()})

            saver = Checkpoint(save, every_s=checkpoint_every, stop_after_s=stop_after or math.inf)
            cache_dir = Settings().data_dir / "kernels"
            measurer = live_measurer(table, backend=backend, cache_dir=cache_dir, worker=worker, repeats=repeats,
                                     checkpoint=saver, timeout_s=timeout)
            if devices > 1:
                def save_devices(table: MeasurementTable, kernels: int) -> None:
                    measurer.evaluations = kernels  # the command's count: the shards' kernels, then its own
                    save(table)

                _measure_on_devices(config, table, devices=devices, backend=backend, repeats=repeats,
                                    timeout_s=timeout, cache_dir=cache_dir, stop_after_s=stop_after,
                                    save=save_devices, checkpoint=checkpoint)

        def progress(message: str) -> None:
            console.print(f"[{time.monotonic() - started:5.0f} s, {measurer.evaluations} kernels] {message}",
                          markup=False)

        try:
            outcomes = run_bench(config, measurer, progress=progress)
        except RunStopped as e:
            _stopped(e, measurer.table, checkpoint)
        except (EmbedError, MissingMeasurementError, UnknownNameError) as e:
            fail(str(e).splitlines()[0])
        if replay is None:
            save(measurer.table)
    out.parent.mkdir(parents=True, exist_ok=True)
    provisional = isinstance(measurer, ProvisionalReplay)
    if provisional:
        measurer.forget()  # the report counts the recording's own measurements
    markdown = report_markdown(outcomes, config, measurer, runs)
    if provisional:  # its table holds made-up failures: no JSON, which would replay as a recording
        markdown = (f"**Provisional**: the {measurer.missing} measurements {replay} lacks were taken as failed "
                    f"kernels (a run resuming it measures them).\n\n{markdown}")
    out.with_suffix(".md").write_text(markdown)
    if not provisional:
        out.with_suffix(".json").write_text(json.dumps(report_json(outcomes, config, measurer, runs), indent=1))
    typer.echo(markdown)
