from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from db.errors import DbError
from db.models import Device
from db.repositories.devices import DeviceIn, upsert_device
from db.session import Database, normalize_url


def test_postgresql_urls_get_the_psycopg_driver() -> None:
    assert normalize_url("postgresql://u:pw@h:5432/d").startswith("postgresql+psycopg://u:pw@h:5432/d")
    assert normalize_url("sqlite:///x.db") == "sqlite:///x.db"


@pytest.mark.parametrize("url", ["mysql://h/d", "not a url"])
def test_other_backends_and_garbage_are_refused(url: str) -> None:
    with pytest.raises(DbError):
        normalize_url(url)


def test_sqlite_runs_in_wal_mode_with_foreign_keys(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'sub' / 'x.db'}")  # the folder is made
    with database.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
    database.dispose()


def test_scope_commits_on_success_and_rolls_back_on_error(database: Database) -> None:
    with database.scope() as session:
        upsert_device(session, DeviceIn("a", "cpu", "x86_64"))
    with pytest.raises(RuntimeError), database.scope() as session:
        upsert_device(session, DeviceIn("b", "cpu", "x86_64"))
        raise RuntimeError("boom")
    with database.scope() as session:
        assert list(session.scalars(select(Device.name))) == ["a"]
        assert session.scalar(select(func.count()).select_from(Device)) == 1
