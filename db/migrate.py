"""Apply and check Alembic migrations. The scripts ship inside the package: no alembic.ini is needed.

A database already at :data:`HEAD` is recognised with one query, without importing Alembic (whose Mako templates
import Pygments: 0.2-0.3 s of the first optimize of a process).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from db.errors import SchemaOutOfDateError

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"
UPGRADE_HINT = "run `tunebank db upgrade`"
#: The newest revision of ``migrations/versions`` (``tests/db/test_migrate.py`` holds it to Alembic's head).
HEAD = "0003"


def _config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None, "the migrations folder holds no revision"
    return head


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def _at_head(engine: Engine) -> bool:
    """Whether the database's recorded revision is :data:`HEAD` (False where it records none)."""
    try:
        with engine.connect() as connection:
            return connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [HEAD]
    except DBAPIError:  # no alembic_version table: no schema yet
        return False


def upgrade(engine: Engine, revision: str = "head") -> str:
    """Migrate the database up to ``revision``; returns the revision it is at afterwards."""
    if revision in ("head", HEAD) and _at_head(engine):
        return HEAD
    from alembic import command

    return _run(engine, command.upgrade, revision)


def downgrade(engine: Engine, revision: str) -> str:
    """Migrate the database down to ``revision`` (``"base"``: drop everything); returns where it is afterwards."""
    from alembic import command

    return _run(engine, command.downgrade, revision)


def _run(engine: Engine, step: Callable[[Config, str], None], revision: str) -> str:
    with engine.begin() as connection:
        config = _config()
        config.attributes["connection"] = connection
        step(config, revision)
    return current_revision(engine) or "base"


def check_schema(engine: Engine) -> None:
    """Raise ``SchemaOutOfDateError`` unless the database is at the code's head revision."""
    if _at_head(engine):
        return
    from alembic.script import ScriptDirectory

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
