"""``tunebank tune MODEL --strategy transfer`` over a database the crawler filled (synthetic measurements)."""

import json
from pathlib import Path

import pytest
import typer
from rich.console import Console
from sqlalchemy import text
from typer.testing import CliRunner

from db.migrate import upgrade
from db.session import Database
from embed import zoo
from embed.partition import partition
from embed.subgraph import Subgraph
from service.crawl import crawl
from service.measure import MeasurementTable, Measurer
from tests.service.conftest import DEVICE, synthetic_measurer, synthetic_seconds
from transforms.recipe import Recipe, parse
from transforms.results import RunResult
from transforms.space import default_recipe
from transforms.tune import Task, make_task
from tunebank.cli import tune
from tunebank.cli.tune import tune_command

QUERY = "lm_head-h64-v128-t16"  # same kinds as the crawled tiny models, other shapes


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[CliRunner, typer.Typer, Database]:
    monkeypatch.setenv("TUNEBANK_DATA_DIR", str(tmp_path))
    # the table's title and headers on one line, whatever terminal width the test process inherited (COLUMNS)
    monkeypatch.setattr(tune, "console", Console(width=200))
    monkeypatch.setattr(tune, "transfer_measurer", lambda backend, cache_dir, worker, **_: synthetic_measurer())
    app = typer.Typer()
    app.command()(tune_command)
    database = Database(f"sqlite:///{tmp_path / 'tunebank.db'}")
    return CliRunner(), app, database


def picky_measurer() -> Measurer:
    """The synthetic cost model, but every recipe faster than the task's default recipe fails validation (and
    still reports its time, as a kernel timed before it was checked would)."""

    def run(task: Task, recipes: list[Recipe]) -> list[RunResult]:
        default = synthetic_seconds(task, default_recipe(task.program))
        return [RunResult(ok=synthetic_seconds(task, r) >= default, median_s=synthetic_seconds(task, r), repeats=1,
                          error_kind=None if synthetic_seconds(task, r) >= default else "wrong") for r in recipes]

    return Measurer(MeasurementTable(DEVICE, "synthetic"), run=run, eager_time=lambda task: 1.5e-3)


def test_tune_transfer_reports_neighbours_and_a_validated_winner(cli: tuple[CliRunner, typer.Typer, Database],
                                                                  tiny_subgraphs: list[Subgraph],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    runner, app, database = cli
    args = [QUERY, "--strategy", "transfer", "--backend", "cpu", "--k", "2"]
    empty = runner.invoke(app, args)
    assert empty.exit_code == 2 and "no tunebank schema" in empty.output and "tunebank db upgrade" in empty.output
    upgrade(database.engine)
    bare = runner.invoke(app, args)
    assert bare.exit_code == 2 and "run the crawler" in bare.output and "cpu:test" in bare.output

    crawl(database, tiny_subgraphs, synthetic_measurer(), backend="cpu", budget=4)
    with database.scope() as session:
        stored = {h for (h,) in session.execute(text("select structural_hash from subgraphs"))}
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    query = {s.structural_hash for s in partition(zoo.load(QUERY)) if s.tunable}
    assert {r["structural_hash"] for r in rows} == query and len(rows) == 2
    tasks = {s.structural_hash: make_task(s) for s in partition(zoo.load(QUERY)) if s.tunable}
    defaults = {h: str(default_recipe(t.program)) for h, t in tasks.items()}
    for row in rows:  # the fastest of the default and the neighbours' recipes by the cost model, all of them valid
        assert 1 <= len(row["neighbours"]) <= 2 and {n["structural_hash"] for n in row["neighbours"]} <= stored
        cost = {r: synthetic_seconds(tasks[row["structural_hash"]], parse(r))
                for r in {defaults[row["structural_hash"]], *(n["recipe"] for n in row["neighbours"])}}
        # a fastest one: recipes can tie in the synthetic times, and a set's order changes with the hash seed
        assert row["evaluations"] == len(cost) and cost[row["winner"]] == min(cost.values())
        assert (row["winner_s"], row["default_s"]) == (min(cost.values()), cost[defaults[row["structural_hash"]]])
    assert any(row["winner"] != defaults[row["structural_hash"]] for row in rows)  # a neighbour's recipe won

    # now every recipe faster than the default computes wrong outputs: the winner is the default, the only valid one
    monkeypatch.setattr(tune, "transfer_measurer", lambda backend, cache_dir, worker, **_: picky_measurer())
    picky = json.loads(runner.invoke(app, [*args, "--json"]).output)
    assert [(r["winner"], r["speedup"]) for r in picky] == [(defaults[r["structural_hash"]], 1.0) for r in rows]
    table = runner.invoke(app, [*args, "--local-budget", "2", "--encoder", "learned"])
    assert table.exit_code == 0, table.output
    assert "transfer (learned, k 2, local budget 2)" in table.output and "winner (validated)" in table.output
    wide = json.loads(runner.invoke(app, [*args, "--per-neighbour", "3", "--json"]).output)
    for row, narrow in zip(wide, rows, strict=True):  # up to 3 recipes from each of the same 2 neighbours
        assert {n["structural_hash"] for n in row["neighbours"]} == {n["structural_hash"] for n in narrow["neighbours"]}
        assert len(narrow["neighbours"]) <= len(row["neighbours"]) <= 3 * len(narrow["neighbours"])
    assert runner.invoke(app, [*args, "--encoder", "nope"]).exit_code == 2
