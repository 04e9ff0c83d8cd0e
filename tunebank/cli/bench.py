"""``tunebank bench transfer``: leave-one-model-out evaluation of transfer tuning; writes markdown and JSON."""

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from embed.errors import EmbedError
from embed.registry import UnknownNameError
from service.bench_transfer import BenchConfig, report_json, report_markdown, run_bench
from service.measure import MeasurementTable, Measurer, MissingMeasurementError, live_measurer
from tunebank.cli.errors import fail
from tunebank.settings import Settings

app = typer.Typer(help="Benchmarks.", no_args_is_help=True)
console = Console(stderr=True, highlight=False)

DEFAULT_MODELS = "bert_encoder-h128-s64-b1,gpt_decoder-h128-s32-b2,mixer_block-h128-s32-b1,lm_head-h128-v512-t64"


def _csv(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def toolchain(backend: str) -> str:
    """The compiler identity recorded with measurements on ``backend``."""
    if backend == "cpu":
        from transforms.compilers.cpu import toolchain_id

        return toolchain_id()
    from transforms.compilers.cuda import toolchain_id as cuda_toolchain

    return " ".join(t for t in (cuda_toolchain("nvrtc"), cuda_toolchain("nvcc")) if t) or "cuda"


@app.command("transfer")
def transfer_command(
    models: Annotated[str, typer.Option(help="comma-separated zoo names or .onnx files")] = DEFAULT_MODELS,
    backend: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    budget: Annotated[int, typer.Option(min=1, help="recipes searched per subgraph for the optimum")] = 32,
    k: Annotated[str, typer.Option("--k", help="neighbour counts, comma-separated")] = "1,3,5,10",
    encoders: Annotated[str, typer.Option(help="comma-separated encoders")] = "static,static+profiled,learned",
    held_out: Annotated[str, typer.Option(help="models to hold out (default: each of --models)")] = "",
    local_budget: Annotated[int, typer.Option(min=0, help="local-search recipes after transfer")] = 0,
    strategy: Annotated[str, typer.Option(help="search for the optimum: exhaustive | random | evolutionary")] = (
        "evolutionary"),
    repeats: Annotated[int, typer.Option(min=1, help="timed runs per kernel (median)")] = 10,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    cpu_threads: Annotated[int, typer.Option(min=0, help="OpenMP threads for cpu kernels (0: leave as is)")] = 0,
    replay: Annotated[Path | None, typer.Option(help="replay the measurements of an earlier JSON report")] = None,
    out: Annotated[Path, typer.Option(help="output path without suffix: writes OUT.md and OUT.json")] = Path(
        "bench/results/transfer"),
) -> None:
    """Leave-one-model-out over MODELS: transfer with each k and encoder vs the optimum, default, random, eager."""
    if backend not in ("cpu", "cuda"):
        fail(f"unknown backend {backend!r}; choose cpu or cuda")
    try:
        config = BenchConfig(models=_csv(models), backend=backend, budget=budget,
                             ks=tuple(int(v) for v in _csv(k)), encoders=_csv(encoders),
                             held_out=_csv(held_out) or None, strategy=strategy, local_budget=local_budget, seed=seed)
    except (ValueError, UnknownNameError) as e:
        fail(str(e))
    if cpu_threads:
        os.environ["OMP_NUM_THREADS"] = str(cpu_threads)  # read by the kernel worker processes started below
    from transforms.run import Worker

    with Worker() as worker:
        if replay is not None:
            try:
                table = MeasurementTable.from_json(json.loads(replay.read_text())["measurements"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                fail(f"cannot read a recording from {replay}: {e}")
            measurer = Measurer(table)
        else:
            from service.devices import detect_device

            table = MeasurementTable(detect_device(backend), toolchain(backend))
            measurer = live_measurer(table, backend=backend, cache_dir=Settings().data_dir / "kernels",
                                     worker=worker, repeats=repeats)
        try:
            outcomes = run_bench(config, measurer, progress=lambda message: console.print(message, markup=False))
        except (EmbedError, MissingMeasurementError, UnknownNameError) as e:
            fail(str(e).splitlines()[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    markdown = report_markdown(outcomes, config, measurer)
    out.with_suffix(".md").write_text(markdown)
    out.with_suffix(".json").write_text(json.dumps(report_json(outcomes, config, measurer), indent=1))
    typer.echo(markdown)
