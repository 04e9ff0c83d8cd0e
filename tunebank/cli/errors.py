"""How the CLI ends on bad input: one line on stderr and exit code 2, never a traceback."""

from typing import NoReturn

import typer
from rich.console import Console

from tunebank.cli.text import printable

_stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: MESSAGE`` (one line, control characters escaped) and exit with ``code`` (2: bad input)."""
    _stderr.print(f"error: {printable(' '.join(message.split()), 1000)}", markup=False)
    raise typer.Exit(code=code)


def warn(message: str) -> None:
    _stderr.print(f"warning: {printable(' '.join(message.split()), 1000)}", markup=False)
