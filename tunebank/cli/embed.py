"""``tunebank embed train|promote``: fit a new encoder version from the database, embed every profiled subgraph
with it, and (optionally) promote it; the previously promoted version stays in use until then."""

import re
from typing import Annotated

import typer
from rich.console import Console

from db.errors import DbError
from db.migrate import check_schema
from db.repositories.devices import list_devices
from embed.encoders import EncoderError
from embed.registry import UnknownNameError
from service.embeddings import EncoderStore, embed_subgraphs, fit_encoder, profiled_subgraphs
from transforms.backends import BackendUnavailableError, resolve_backend
from tunebank.cli.common import open_database, settings
from tunebank.cli.errors import fail
from tunebank.settings import Settings

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}")

app = typer.Typer(help="Performance-embedding encoders.", no_args_is_help=True)
console = Console(highlight=False)


def _store(settings: Settings) -> EncoderStore:
    return EncoderStore(settings.data_dir / "encoders")


@app.command("train")
def train_command(
    device: Annotated[str, typer.Option(help="device name (as registered by the crawler)")],
    encoder: Annotated[str, typer.Option(help="static | static+profiled | learned")] = "learned",
    backend: Annotated[str, typer.Option(help="auto | cpu | cuda: the backend the device's recipes are for (auto: "
                                              "cuda when CuPy sees a GPU, else cpu)")] = "auto",
    promote: Annotated[bool, typer.Option(help="make the new version the one searches use")] = False,
    seed: Annotated[int, typer.Option(help="training seed")] = 0,
) -> None:
    """Fit ENCODER on the device's profiled subgraphs (and cross-applications), store it as a new version, and
    embed every profiled subgraph with it."""
    config = settings()
    try:
        backend = resolve_backend(backend)
    except (ValueError, BackendUnavailableError) as e:
        fail(str(e))
    store = _store(config)
    database = open_database(config)
    try:
        check_schema(database.engine)
        with database.scope() as session:
            known = {d.name: d.id for d in list_devices(session)}
            if device not in known:
                fail(f"unknown device {device!r}; known devices: {', '.join(sorted(known)) or 'none (crawl first)'}")
            device_id = known[device]
            ids = profiled_subgraphs(session, device_id)
            if len(ids) < 2:
                fail(f"device {device!r} has {len(ids)} profiled subgraphs; crawl more before training")
            fitted = fit_encoder(session, encoder, device_id=device_id, subgraph_ids=ids, backend=backend, seed=seed)
            embed_subgraphs(session, fitted, device_id=device_id, subgraph_ids=ids)
        store.save(fitted)
        previous = store.promoted(encoder)
        if promote:
            store.promote(encoder, fitted.version)
    except (DbError, EncoderError, UnknownNameError, LookupError) as e:
        fail(str(e).splitlines()[0])
    except OSError as e:
        fail(f"TUNEBANK_DATA_DIR={str(config.data_dir)!r}: cannot store the encoder: {e.strerror or e}")
    finally:
        database.dispose()
    state = "promoted" if promote else f"not promoted (in use: {previous or 'none'})"
    console.print(f"{encoder} version {fitted.version}: {len(ids)} subgraphs embedded; {state}", markup=False)


@app.command("promote")
def promote_command(
    encoder: Annotated[str, typer.Argument(help="encoder name")],
    version: Annotated[str, typer.Argument(help="a stored version")],
) -> None:
    """Make VERSION of ENCODER the one searches use."""
    for what, name in (("encoder", encoder), ("version", version)):
        if not _NAME.fullmatch(name) or ".." in name:
            fail(f"{what} {name[:80]!r} is not a valid name (letters, digits, '_', '.', '+', '-')")
    try:
        _store(settings()).promote(encoder, version)
    except LookupError as e:
        fail(str(e))
    console.print(f"{encoder}: version {version} promoted", markup=False)
