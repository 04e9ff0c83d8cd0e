"""``tunebank serve``: the HTTP API (OpenAPI at /docs) under uvicorn, jobs in this process by default.

It binds to 127.0.0.1 unless told otherwise, and refuses to bind anywhere else while the database holds no live API
key (on loopback, requests without a key are served until the first key is created)."""

from typing import Annotated

import typer

from tunebank.cli.common import data_folder, open_database
from tunebank.cli.errors import fail


def _settings():  # noqa: ANN202
    from pydantic import ValidationError

    from tunebank.server_settings import ServerSettings

    try:
        return ServerSettings()
    except ValidationError as exc:
        err = exc.errors()[0]
        name = "TUNEBANK_" + ".".join(str(p) for p in err["loc"]).upper()
        fail(f"{name}={str(err.get('input'))[:100]!r}: {str(err['msg']).removeprefix('Value error, ')}")


def serve_command(
    host: Annotated[str, typer.Option(help="address to bind (anything but loopback needs an API key to exist)")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="port to listen on")] = 8000,
    executor: Annotated[str | None, typer.Option(help="embedded | celery | none (default: TUNEBANK_EXECUTOR)")]
    = None,
    backend: Annotated[str | None, typer.Option(help="auto | cpu | cuda, for embedded jobs")] = None,
    log_level: Annotated[str, typer.Option(help="debug | info | warning")] = "info",
) -> None:
    """Serve the HTTP API: optimize jobs, plans, subgraphs, search, ingest, stats, health and metrics."""
    from sqlalchemy import exists, select

    from db.migrate import upgrade
    from db.models import ApiKey
    from tunebank.server_settings import is_loopback, server_config

    updates = {k: v for k, v in {"executor": executor, "backend": backend}.items() if v is not None}
    if executor is not None and executor not in ("embedded", "celery", "none"):
        fail(f"--executor {executor!r}: choose embedded, celery or none")
    config = _settings().model_copy(update=updates)
    data_folder(config, "plans")
    database = open_database(config, create=True)
    try:
        upgrade(database.engine)
        with database.scope() as session:
            keys = bool(session.scalar(select(exists().where(ApiKey.revoked.is_(False)))))
    except Exception as e:  # noqa: BLE001 (driver and migration errors: one line)
        fail(f"cannot prepare the database: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    finally:
        database.dispose()
    if not is_loopback(host) and not keys:
        fail(f"refusing to serve on {host!r} with no API key: anyone who reaches it could use it. Create one first "
             "(`tunebank keys create --scopes read,optimize`), or bind to 127.0.0.1")
    import uvicorn

    from service.http.app import create_app

    app = create_app(server_config(config, host=host))
    typer.echo(f"tunebank serving http://{host}:{port} (docs: /docs; jobs: {config.executor}; "
               f"{'API keys required' if keys or not is_loopback(host) else 'no key needed until one is created'})",
               err=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_keep_alive=30)
