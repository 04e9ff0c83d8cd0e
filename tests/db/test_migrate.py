from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from db.errors import SchemaOutOfDateError
from db.migrate import HEAD, MIGRATIONS, check_schema, current_revision, downgrade, head_revision, upgrade
from db.models import Base
from db.session import Database


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty_database(request, tmp_path: Path):
    if request.param == "sqlite":
        database = Database(f"sqlite:///{tmp_path / 'empty.db'}")
    else:
        database = Database(request.getfixturevalue("pg_fresh_url")("migrate"))
    yield database
    database.dispose()


def test_scripts_ship_inside_the_package() -> None:
    assert MIGRATIONS.is_dir() and (MIGRATIONS / "env.py").is_file()
    assert head_revision() == HEAD == "0003"  # a new migration moves HEAD too


def test_a_database_at_head_is_upgraded_and_checked_without_importing_alembic(empty_database: Database) -> None:
    import subprocess
    import sys

    upgrade(empty_database.engine)
    url = empty_database.engine.url.render_as_string(hide_password=False)
    script = ("import sys\nfrom db.session import Database\nfrom db.migrate import check_schema, upgrade\n"
              f"engine = Database({url!r}).engine\nprint(upgrade(engine)); check_schema(engine)\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('alembic', 'mako')))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2]).stdout.split("\n")
    assert out[:2] == ["0003", "[]"]


def test_upgrade_from_empty_creates_every_table_and_matches_the_models(empty_database: Database) -> None:
    with pytest.raises(SchemaOutOfDateError, match="run `tunebank db upgrade`"):
        check_schema(empty_database.engine)
    assert upgrade(empty_database.engine) == head_revision()
    check_schema(empty_database.engine)
    tables = set(inspect(empty_database.engine).get_table_names())
    assert {t.name for t in Base.metadata.sorted_tables} | {"alembic_version"} == tables
    with empty_database.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata) == []


def test_upgrade_is_repeatable_and_downgrade_round_trips(empty_database: Database) -> None:
    upgrade(empty_database.engine)
    assert upgrade(empty_database.engine) == "0003"
    assert downgrade(empty_database.engine, "0001") == "0001"
    assert not {"baselines", "demand"} & set(inspect(empty_database.engine).get_table_names())
    assert downgrade(empty_database.engine, "base") == "base"
    assert current_revision(empty_database.engine) is None
    assert upgrade(empty_database.engine) == "0003"


def test_a_schema_from_a_newer_release_is_refused(empty_database: Database) -> None:
    upgrade(empty_database.engine)
    with empty_database.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(SchemaOutOfDateError, match="does not know"):
        check_schema(empty_database.engine)
