"""A live ``tunebank serve`` for the client and CLI tests: a real uvicorn process on 127.0.0.1 over SQLite, then over
a fresh PostgreSQL schema, with the cpu backend, and two keys (``alice``: read and optimize, ``bob``: read).

A test module changes the server's settings by overriding the ``server_settings`` fixture, and its databases by
overriding ``database_env``; each module gets its own server."""

import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(env: dict[str, str], *args: str) -> str:
    """``tunebank ARGS`` in this process (``serve`` alone runs as a process of its own)."""
    from typer.testing import CliRunner

    from tunebank.cli import app

    done = CliRunner().invoke(app, list(args), env=env)
    assert done.exit_code == 0, done.output
    return done.stdout


@contextmanager
def running_server(env: dict[str, str], *args: str) -> Iterator[str]:
    """``tunebank serve ARGS`` on a free loopback port with ``env``, ready (``/readyz`` 200); its URL."""
    port = free_port()
    # the server's log goes to a file: a pipe nobody reads fills up (64 KiB) and then blocks the server mid-request
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below)
    proc = subprocess.Popen([sys.executable, "-m", "tunebank", "serve", "--port", str(port), "--log-level",
                             "warning", *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise AssertionError(log.read().decode(errors="replace")[-4000:])
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a wedged server: its threads never return
            proc.kill()
            proc.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_env(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """``TUNEBANK_DATABASE_URL`` for the server: none (SQLite in the data folder), or a new PostgreSQL schema."""
    if request.param == "sqlite":
        yield {}
        return
    import psycopg

    from tests.db.conftest import PG_SERVER, _require_postgres, pg_url

    _require_postgres()
    schema = f"tb_client_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(PG_SERVER, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    yield {"TUNEBANK_DATABASE_URL": pg_url(schema)}
    with psycopg.connect(PG_SERVER, autocommit=True) as connection:
        connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(scope="module")
def server_settings() -> dict[str, str]:
    """``TUNEBANK_*`` settings of the server beyond the data folder, database and backend."""
    return {}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, database_env: dict[str, str],
           server_settings: dict[str, str]) -> Iterator[tuple[str, dict[str, str], dict[str, str]]]:
    """A ``tunebank serve`` process (SQLite, then PostgreSQL): its URL, its environment, and secrets of keys by name."""
    data = tmp_path_factory.mktemp("served")
    env = {**os.environ, "TUNEBANK_DATA_DIR": str(data), "TUNEBANK_BACKEND": "cpu", "OMP_NUM_THREADS": "1",
           **database_env, **server_settings}
    cli(env, "db", "upgrade")
    keys = {name: cli(env, "keys", "create", "--scopes", scopes, "--name", name).splitlines()[1]
            for name, scopes in (("alice", "read,optimize"), ("bob", "read"))}
    with running_server(env) as url:
        yield url, env, keys
