"""``tunebank tune MODEL --strategy transfer`` over a database the crawler filled (synthetic measurements)."""

import json
from pathlib import Path

import pytest
import typer
from sqlalchemy import text
from typer.testing import CliRunner

from db.migrate import upgrade
from db.session import Database
from embed import zoo
from embed.partition import partition
from embed.subgraph import Subgraph
from service.crawl import crawl
from tests.service.conftest import synthetic_measurer
from tunebank.cli import tune
from tunebank.cli.tune import tune_command

QUERY = "lm_head-h64-v128-t16"  # same kinds as the crawled tiny models, other shapes


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[CliRunner, typer.Typer, Database]:
    monkeypatch.setenv("TUNEBANK_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(tune, "transfer_measurer", lambda backend, cache_dir, worker: synthetic_measurer())
    app = typer.Typer()
    app.command()(tune_command)
    database = Database(f"sqlite:///{tmp_path / 'tunebank.db'}")
    return CliRunner(), app, database


def test_tune_transfer_reports_neighbours_and_a_validated_winner(cli: tuple[CliRunner, typer.Typer, Database],
                                                                  tiny_subgraphs: list[Subgraph]) -> None:
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
    for row in rows:
        assert 1 <= len(row["neighbours"]) <= 2 and {n["structural_hash"] for n in row["neighbours"]} <= stored
        assert 1 <= row["evaluations"] <= 3 and row["winner_s"] <= row["default_s"] and row["speedup"] >= 1.0
        assert row["winner"] in {n["recipe"] for n in row["neighbours"]} or row["speedup"] == 1.0
    table = runner.invoke(app, [*args, "--local-budget", "2", "--encoder", "learned"])
    assert table.exit_code == 0, table.output
    assert "transfer (learned, k 2, local budget 2)" in table.output and "winner (validated)" in table.output
    wide = json.loads(runner.invoke(app, [*args, "--per-neighbour", "3", "--json"]).output)
    for row, narrow in zip(wide, rows, strict=True):  # up to 3 recipes from each of the same 2 neighbours
        assert {n["structural_hash"] for n in row["neighbours"]} == {n["structural_hash"] for n in narrow["neighbours"]}
        assert len(narrow["neighbours"]) <= len(row["neighbours"]) <= 3 * len(narrow["neighbours"])
    assert runner.invoke(app, [*args, "--encoder", "nope"]).exit_code == 2
