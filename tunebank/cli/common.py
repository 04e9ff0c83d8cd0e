"""What the commands share at the edge: settings read once with one-line errors, model specs, the data folder and
the database, each refused in one line that names the setting to fix."""

import math
import os
import stat
from pathlib import Path

from pydantic import ValidationError

from db.session import Database
from embed.errors import EmbedError
from embed.importers import load_model
from embed.ir import Graph
from embed.registry import UnknownNameError
from tunebank.cli.errors import fail
from tunebank.settings import Settings

_SQLITE_HEADER = b"SQLite format 3\0"


def settings() -> Settings:
    """``Settings()``, or one line naming the first ``TUNEBANK_*`` variable that is wrong."""
    try:
        return Settings()
    except ValidationError as exc:
        err = exc.errors()[0]
        name = "TUNEBANK_" + ".".join(str(p) for p in err["loc"]).upper()
        fail(f"{name}={str(err.get('input'))[:100]!r}: {str(err['msg']).removeprefix('Value error, ')}")


def model_spec(spec: str) -> str:
    """``zoo:NAME``, a path (``.onnx``, ``.json``, in a folder, or on disk), or a bare zoo name (``gcn-n64-f16-d0.05``):
    what ``inspect`` and ``tune`` both take."""
    if spec.startswith("zoo:") or spec.lower().endswith((".onnx", ".json")) or os.sep in spec or os.path.lexists(spec):
        return spec
    return f"zoo:{spec}"


def load_graph(spec: str, config: Settings) -> Graph:
    """The model ``spec`` names, within the model limits of ``config``; any failure is one line and exit 2."""
    try:
        graph = load_model(model_spec(spec), max_bytes=config.max_model_bytes)
    except (EmbedError, UnknownNameError) as exc:
        fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except MemoryError:
        fail(f"out of memory importing {spec!r}: the model is too large for this machine")
    except RecursionError:
        fail(f"{spec!r} is nested too deeply to import")
    if len(graph.nodes) > config.max_nodes:
        fail(f"the model has {len(graph.nodes)} nodes, over the limit of {config.max_nodes} (TUNEBANK_MAX_NODES)")
    for name, tensor in graph.tensors.items():
        if tensor.numel > config.max_tensor_elements:
            fail(f"tensor {name[:80]!r} has shape {list(tensor.shape)}: {tensor.numel} elements, over the limit of "
                 f"{config.max_tensor_elements} (TUNEBANK_MAX_TENSOR_ELEMENTS)")
    return graph


def problem_bytes(graph: Graph) -> int:
    """What validating a kernel of ``graph`` may take: every tensor in its own dtype, plus a float64 copy for the
    reference (an upper bound: intermediates of a fused kernel are never all alive)."""
    return sum(math.prod(t.shape) * (t.dtype.itemsize + 8) for t in graph.tensors.values())


def data_folder(config: Settings, name: str) -> Path:
    """``data_dir/name``, made private (0700) when missing; refused in one line when it cannot be made or written."""
    folder = config.data_dir / name
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(13, "not a writable folder")
    except OSError as exc:
        fail(f"TUNEBANK_DATA_DIR={str(config.data_dir)!r}: cannot use {folder}: {exc.strerror or exc}")
    return folder


def open_database(config: Settings, *, create: bool = False) -> Database:
    """The database of ``config``. A read (``create=False``) never makes one: a missing SQLite file is an error, as is
    a file that is not SQLite. PostgreSQL is connected once here, so an unreachable server is one line."""
    url = config.resolved_database_url
    setting = "TUNEBANK_DATABASE_URL" if config.database_url else "TUNEBANK_DATA_DIR"
    where = f"{setting}={(_redacted(config.database_url) if config.database_url else str(config.data_dir))[:200]!r}"
    try:
        from sqlalchemy import text
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
            _check_sqlite_file(Path(parsed.database), create=create)
        postgres = parsed.get_backend_name() == "postgresql"
        database = Database(url, **({"connect_args": {"connect_timeout": 10}} if postgres else {}))
        if postgres:
            with database.engine.connect() as connection:
                connection.execute(text("select 1"))
    except _Refused as exc:
        fail(f"{where}: {exc}")
    except Exception as exc:  # noqa: BLE001 (bad URLs, drivers, servers: one line naming the setting)
        message = str(exc).strip().splitlines()
        fail(f"{where}: cannot open the database: {message[0][:300] if message else type(exc).__name__}")
    return database


def _redacted(url: str) -> str:
    """``url`` with its password hidden (an error message may end up in a log)."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 (unparseable: shown up to its first '@' only)
        return url.split("@")[-1] if "@" in url else url


class _Refused(Exception):
    pass


def _check_sqlite_file(path: Path, *, create: bool) -> None:
    try:
        info = path.stat()
    except FileNotFoundError:
        if create:
            return
        raise _Refused(f"there is no database at {path} (it has no tunebank schema: run `tunebank db upgrade`)") \
            from None
    except OSError as exc:
        raise _Refused(f"cannot read {path}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise _Refused(f"{path} is not a regular file")
    if info.st_size:
        try:
            with path.open("rb") as f:
                header = f.read(len(_SQLITE_HEADER))
        except OSError as exc:
            raise _Refused(f"cannot read {path}: {exc.strerror}") from None
        if header != _SQLITE_HEADER:
            raise _Refused(f"{path} is not an SQLite database")
