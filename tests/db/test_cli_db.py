"""``tunebank db upgrade|stats`` (tunebank/cli/db.py), run through typer's test runner."""

from pathlib import Path

from typer.testing import CliRunner

from db.migrate import head_revision
from db.repositories.measurements import MeasurementIn, ingest_measurements
from db.session import Database
from tunebank.cli.db import app

runner = CliRunner()


def test_stats_refuses_an_unmigrated_database_and_upgrade_fixes_it(tmp_path: Path) -> None:
    env = {"TUNEBANK_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}"}
    refused = runner.invoke(app, ["stats"], env=env)
    assert refused.exit_code == 2
    assert "has no tunebank schema: run `tunebank db upgrade`" in refused.output
    upgraded = runner.invoke(app, ["upgrade"], env=env)
    head = head_revision()
    assert upgraded.exit_code == 0 and f"schema empty -> {head}" in upgraded.output
    assert f"schema {head} -> {head}" in runner.invoke(app, ["upgrade"], env=env).output


def test_stats_prints_counts_per_table_device_and_kind(database: Database, seed) -> None:
    s = seed(database, 3)
    with database.scope() as session:
        ingest_measurements(session, [MeasurementIn(h, "fuse(all)", "h100", "t", 1e-3) for h in s.hashes])
    result = runner.invoke(app, ["stats"], env={"TUNEBANK_DATABASE_URL": database.url})
    assert result.exit_code == 0, result.output
    lines = [" ".join(line.replace("│", " ").split()) for line in result.output.splitlines()]
    assert "measurements 3" in lines and "subgraphs 3" in lines and "jobs 0" in lines
    assert "h100 cuda:sm_90 3 3 3 0" in lines
    assert "reduction 1 1 1" in lines and "pointwise 1 1 1" in lines


def test_a_bad_url_is_one_line_not_a_traceback() -> None:
    result = runner.invoke(app, ["stats"], env={"TUNEBANK_DATABASE_URL": "mysql://x/y"})
    assert result.exit_code == 2
    assert result.output.strip() == ("error: TUNEBANK_DATABASE_URL='mysql://x/y': cannot open the database: "
                                     "unsupported database backend 'mysql'; use sqlite or postgresql")
