"""Apply and check Alembic migrations. The scripts ship inside the package: no alembic.ini is needed."""

from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from db.errors import SchemaOutOfDateError

MIGRATIONS = Path(__file__).parent / "migrations"
UPGRADE_HINT = "run `tunebank db upgrade`"


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None, "the migrations folder holds no revision"
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> str:
    """Migrate the database up to ``revision``; returns the revision it is at afterwards."""
    return _run(engine, command.upgrade, revision)


def downgrade(engine: Engine, revision: str) -> str:
    """Migrate the database down to ``revision`` (``"base"``: drop everything); returns where it is afterwards."""
    return _run(engine, command.downgrade, revision)


def _run(engine: Engine, step: Callable[[Config, str], None], revision: str) -> str:
    with engine.begin() as connection:
        config = _config()
        config.attributes["connection"] = connection
        step(config, revision)
    return current_revision(engine) or "base"


def check_schema(engine: Engine) -> None:
    """Raise ``SchemaOutOfDateError`` unless the database is at the code's head revision."""
    current, head = current_revision(engine), head_revision()
    if current == head:
        return
    if current is None:
        raise SchemaOutOfDateError(f"database {engine.url.render_as_string()} has no tunebank schema: {UPGRADE_HINT}")
    known = {script.revision for script in ScriptDirectory.from_config(_config()).walk_revisions()}
    if current not in known:
        raise SchemaOutOfDateError(
            f"database schema is at revision {current}, which this version of tunebank does not know "
            f"(expected {head}): upgrade tunebank"
        )
    raise SchemaOutOfDateError(f"database schema is at revision {current}, code expects {head}: {UPGRADE_HINT}")
