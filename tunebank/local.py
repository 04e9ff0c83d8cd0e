"""``tunebank.local()``: the client's calls on the embedded default, without a server to run.

It starts the HTTP app of ``tunebank serve`` in a thread of this process, on a free loopback port, with jobs in this
process and a secret that only this client holds, and returns a :class:`tunebank.Client` on it: the same calls, the
same answers, the settings' database (``TUNEBANK_*``). ``close()`` (or leaving a ``with`` block) stops it.

    with tunebank.local() as tb:
        job = tb.optimize(model, (x,))
        fast = tb.plan(job.id)
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any

from tunebank.client import Client
from tunebank.settings import Settings

START_TIMEOUT_S = 60.0


def local(settings: Settings | None = None, *, backend: str | None = None, progress: bool = True,
          **options: Any) -> Client:
    """A :class:`Client` on an in-process server over ``settings`` (default: ``TUNEBANK_*``); ``backend`` for its
    jobs (auto, cpu, cuda); ``options``: other ``ServerSettings`` fields."""
    import uvicorn

    from db.migrate import upgrade
    from db.session import Database
    from service.http.app import create_app
    from tunebank.server_settings import ServerSettings, server_config

    values = settings.model_dump() if settings is not None else {}
    config = ServerSettings(**{**values, **options, **({"backend": backend} if backend else {}),
                               "executor": "embedded", "rate_limit_per_minute": 0})
    database = Database(config.resolved_database_url)
    upgrade(database.engine)
    database.dispose()
    token = "local_" + secrets.token_urlsafe(32)
    app = create_app(server_config(config, host="127.0.0.1", local_token=token))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True, name="tunebank-local")
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("tunebank.local(): the in-process server did not start (see the log above)")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    client = Client(f"http://127.0.0.1:{port}", token, progress=progress, cache_dir=config.data_dir / "kernels")

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=30)

    client._on_close.append(stop)
    return client
