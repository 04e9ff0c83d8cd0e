"""``python -m tunebank``: the ``tunebank`` command line where the package is not installed (e.g. a GPU machine)."""

from tunebank.cli import app

app(prog_name="tunebank")
