"""How the CLI ends on bad input: one line on stderr and exit code 2, never a traceback."""

from typing import NoReturn

import typer
from rich.console import Console

_stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str) -> NoReturn:
    _stderr.print(f"error: {message}", markup=False)
    raise typer.Exit(code=2)
