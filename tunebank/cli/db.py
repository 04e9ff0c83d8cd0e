"""``tunebank db upgrade|stats``: apply the schema migrations; print what the database holds (a read: it never
creates a database)."""

from dataclasses import asdict
from typing import Annotated

import typer
from rich.table import Table

from db.errors import DbError
from db.migrate import check_schema, current_revision, upgrade
from db.repositories.stats import coverage
from service.strict_json import strict_json
from tunebank.cli.common import open_database, settings
from tunebank.cli.errors import fail
from tunebank.cli.text import plain, stdout_console

app = typer.Typer(help="The performance database: migrations and statistics.", no_args_is_help=True)
console = stdout_console()


@app.command("upgrade")
def upgrade_command(
    revision: Annotated[str, typer.Option("--to", help="target revision")] = "head",
) -> None:
    """Apply the schema migrations (creates the database if it does not exist)."""
    database = open_database(settings(), create=True)
    try:
        before = current_revision(database.engine) or "empty"
        after = upgrade(database.engine, revision)
    except Exception as e:  # noqa: BLE001 (alembic and driver errors: one line, no traceback)
        fail(f"cannot upgrade {database.engine.url.render_as_string()}: {e}")
    finally:
        database.dispose()
    console.print(f"{database.engine.url.render_as_string()}: schema {before} -> {after}", markup=False)


@app.command("stats")
def stats_command(
    as_json: Annotated[bool, typer.Option("--json", help="print the statistics as JSON")] = False,
) -> None:
    """Rows per table, and per device and per subgraph kind what is measured and embedded."""
    database = open_database(settings())
    try:
        check_schema(database.engine)
        with database.scope() as session:
            stats = coverage(session)
    except DbError as e:
        fail(str(e))
    except Exception as e:  # noqa: BLE001 (driver errors on a broken or foreign database: one line)
        fail(f"cannot read {database.engine.url.render_as_string()}: {str(e).splitlines()[0] if str(e) else e!r}")
    finally:
        database.dispose()
    if as_json:
        typer.echo(strict_json(asdict(stats)))
        return
    tables = Table("table", "rows", title="Tables")
    for name, count in stats.tables.items():
        tables.add_row(name, f"{count:,}")
    devices = Table("device", "class", "measured", "ok", "subgraphs", "embedded", title="Per device")
    for d in stats.devices:
        devices.add_row(plain(d.device), plain(d.device_class), f"{d.measurements:,}", f"{d.ok_measurements:,}",
                        f"{d.subgraphs_measured:,}", f"{d.embeddings:,}")  # fmt: skip
    kinds = Table("kind", "subgraphs", "with an ok one", "measured", title="Per subgraph kind (measurements)")
    for k in stats.kinds:
        kinds.add_row(k.kind, f"{k.subgraphs:,}", f"{k.subgraphs_with_ok_measurement:,}", f"{k.measurements:,}")
    for table in (tables, devices, kinds):
        console.print(table)
