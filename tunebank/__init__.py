"""tunebank: transfer tuning for deep-learning models, backed by a performance-embedding database.

    import tunebank
    fast = tunebank.compile(model, (x,))         # or torch.compile(model, backend="tunebank")
    result = tunebank.optimize("model.onnx")      # a plan and its report
    tunebank.save(result, "model.tbplan"); fast = tunebank.load("model.tbplan")
    client = tunebank.Client("http://127.0.0.1:8000", api_key)   # the HTTP service; tunebank.local(): no server

The API lives in ``tunebank.api`` (the client in ``tunebank.client``, ``local`` in ``tunebank.local``) and is
imported on first use, so the command line starts fast.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("tunebank")
except PackageNotFoundError:  # run from a source tree that was not installed (a GPU machine)
    __version__ = "0+unknown"

_API = ("Optimized", "Plan", "PlanError", "PlanModule", "compile", "load", "optimize", "save")
_CLIENT = ("ApiError", "Client")  # the HTTP client: never imports the service
_LOCAL = ("local",)  # the client's calls on the embedded default
__all__ = ["__version__", *_API, *_CLIENT, *_LOCAL]


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(import_module("tunebank.api"), name)
    if name in _CLIENT:
        return getattr(import_module("tunebank.client"), name)
    if name in _LOCAL:
        return getattr(import_module("tunebank.local"), name)
    raise AttributeError(f"module 'tunebank' has no attribute {name!r}")
