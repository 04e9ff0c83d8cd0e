"""``python -m tests.fuzz [CLASS ...]``: the whole corpus (or some classes) through the CLI, one line per run."""

import sys

from tests.fuzz.runner import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
