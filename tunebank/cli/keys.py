"""``tunebank keys create|list|revoke``: API keys of the HTTP service. Only a hash of a secret is stored; the secret
is printed once, when the key is created."""

from typing import Annotated

import typer
from rich.table import Table

from tunebank.cli.common import open_database, settings
from tunebank.cli.errors import fail
from tunebank.cli.text import plain, stdout_console

app = typer.Typer(help="API keys of the HTTP service (`tunebank serve`).", no_args_is_help=True)
SCOPES = ("read", "optimize", "ingest", "admin")  # as service.http.config.SCOPES


def _database():  # noqa: ANN202
    from db.errors import DbError
    from db.migrate import check_schema

    database = open_database(settings())
    try:
        check_schema(database.engine)
    except DbError as e:
        database.dispose()
        fail(str(e))
    return database


@app.command("create")
def create_command(
    scopes: Annotated[str, typer.Option(help="comma-separated: read, optimize, ingest, admin")] = "read,optimize",
    name: Annotated[str, typer.Option(help="who or what uses the key")] = "key",
) -> None:
    """Create a key and print its secret (shown this once: store it now)."""
    from db.repositories.api_keys import issue_api_key

    wanted = sorted({s.strip() for s in scopes.split(",") if s.strip()})
    unknown = [s for s in wanted if s not in SCOPES]
    if not wanted or unknown:
        fail(f"--scopes {scopes!r}: {'unknown scope ' + repr(unknown[0]) if unknown else 'none given'}; "
             f"choose from {', '.join(SCOPES)}")
    if not name.strip() or len(name) > 200:
        fail("--name must be 1 to 200 characters")
    database = _database()
    try:
        with database.scope() as session:
            key, secret = issue_api_key(session, name=name.strip(), scopes=wanted)
            key_id = key.id
    finally:
        database.dispose()
    typer.echo(f"key {key_id} ({name.strip()}), scopes {','.join(wanted)}")
    typer.echo(secret)
    typer.echo("this secret is not shown again: send it as 'Authorization: Bearer <secret>'", err=True)


@app.command("list")
def list_command() -> None:
    """Every key: id, name, scopes, whether revoked, when created and last used (never the secret)."""
    from db.repositories.api_keys import list_api_keys

    database = _database()
    try:
        with database.scope() as session:
            rows = [(k.id, k.name, k.scopes, k.revoked, k.created_at, k.last_used_at) for k in list_api_keys(session)]
    finally:
        database.dispose()
    table = Table("id", "name", "scopes", "status", "created", "last used")
    for key_id, name, scopes, revoked, created, used in rows:
        table.add_row(str(key_id), plain(name), ",".join(scopes), "revoked" if revoked else "live",
                      f"{created:%Y-%m-%d %H:%M}" if created else "-", f"{used:%Y-%m-%d %H:%M}" if used else "-")
    stdout_console().print(table)


@app.command("revoke")
def revoke_command(key_id: Annotated[int, typer.Argument(help="the key's id (`tunebank keys list`)")]) -> None:
    """Revoke a key: the server refuses it from its next request on."""
    from db.errors import NotFoundError
    from db.repositories.api_keys import revoke_api_key

    database = _database()
    try:
        with database.scope() as session:
            revoke_api_key(session, key_id)
    except NotFoundError as e:
        fail(str(e))
    finally:
        database.dispose()
    typer.echo(f"key {key_id} revoked")
