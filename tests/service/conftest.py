"""Shared pieces for the service tests: tiny zoo subgraphs, and a synthetic measurer whose times follow a fixed
cost model (deterministic, no kernels run) so database and transfer logic are tested without timing noise."""

import hashlib

import pytest
import typer

from embed import zoo
from embed.partition import partition
from embed.profile import DeviceSpec
from embed.subgraph import Subgraph
from service.measure import MeasurementTable, Measurer
from transforms.recipe import Recipe
from transforms.results import RunResult
from transforms.tune import Task

DEVICE = DeviceSpec("cpu:test", "cpu:test", "x86_64", bandwidth_gbps=20.0, peak_gflops=100.0, compute_units=2)
TINY_MODELS = ("lm_head-h64-v256-t32", "cnn_head-c32-i7-b1")


def synthetic_seconds(task: Task, recipe: Recipe) -> float:
    """1-2 ms, a fixed pseudo-random function of (kind, recipe): same-kind subgraphs share their best recipes."""
    digest = hashlib.sha256(f"{task.kind}|{recipe}".encode()).digest()
    return 1e-3 * (1 + digest[0] / 255)


def synthetic_measurer() -> Measurer:
    return Measurer(
        MeasurementTable(DEVICE, "synthetic"),
        run=lambda task, recipes: [RunResult(ok=True, median_s=synthetic_seconds(task, r), repeats=1) for r in recipes],
        eager_time=lambda task: 1.5e-3,
    )


@pytest.fixture(scope="session")
def tiny_subgraphs() -> list[Subgraph]:
    return [s for name in TINY_MODELS for s in partition(zoo.load(name)) if s.tunable]


def transfer_cli() -> typer.Typer:
    """``tunebank bench transfer`` alone, for ``CliRunner().invoke(transfer_cli(), [...])``."""
    from tunebank.cli.bench import transfer_command

    app = typer.Typer()
    app.command()(transfer_command)
    return app
