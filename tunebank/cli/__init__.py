"""The ``tunebank`` command line: one typer app, one module per command group."""

import typer

from tunebank.cli import bench, db, embed, keys
from tunebank.cli.crawl import crawl_command
from tunebank.cli.inspect import inspect_command
from tunebank.cli.optimize import optimize_command
from tunebank.cli.serve import serve_command
from tunebank.cli.tune import tune_command
from tunebank.cli.worker import worker_command

app = typer.Typer(
    name="tunebank",
    help="Transfer tuning for deep-learning subgraphs, backed by a performance-embedding database.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command("inspect")(inspect_command)
app.command("tune")(tune_command)
app.command("optimize")(optimize_command)
app.command("crawl")(crawl_command)
app.command("worker")(worker_command)
app.command("serve")(serve_command)
app.add_typer(db.app, name="db")
app.add_typer(embed.app, name="embed")
app.add_typer(bench.app, name="bench")
app.add_typer(keys.app, name="keys")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"tunebank {version('tunebank')}")
        except PackageNotFoundError:  # run from a source tree (python -m tunebank) that pip never installed
            typer.echo("tunebank (source tree, not installed)")
        raise typer.Exit()


@app.callback()
def main(
    show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="print the version"),
) -> None:
    """tunebank: transfer tuning for deep-learning subgraphs."""
