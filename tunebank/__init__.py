"""tunebank: transfer tuning for deep-learning models, backed by a performance-embedding database.

    import tunebank
    fast = tunebank.compile(model, (x,))         # or torch.compile(model, backend="tunebank")
    result = tunebank.optimize("model.onnx")      # a plan and its report
    tunebank.save(result, "model.tbplan"); fast = tunebank.load("model.tbplan")

The API lives in ``tunebank.api`` and is imported on first use, so the command line starts fast.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("tunebank")
except PackageNotFoundError:  # run from a source tree that was not installed (a GPU machine)
    __version__ = "0+unknown"

_API = ("Optimized", "Plan", "PlanError", "PlanModule", "compile", "load", "optimize", "save")
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(import_module("tunebank.api"), name)
    raise AttributeError(f"module 'tunebank' has no attribute {name!r}")
