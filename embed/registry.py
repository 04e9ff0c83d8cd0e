"""One generic registry: names -> implementations, with lazily imported entries.

Used for importers, transformations, strategies, backends and encoders. It lives in ``embed``
because that is the lowest layer; every other layer may import it.

    importers = Registry[Importer]("importer")
    importers.register("onnx", OnnxImporter)                       # an object
    importers.register_lazy("cuda", "transforms.backends.cuda:CudaBackend")  # imported on first use
    importers.get("onnx")
"""

import importlib
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """A registry lookup used a name that is not registered; the message lists the valid names."""

    def __str__(self) -> str:
        return str(self.args[0])


class Registry(Generic[T]):
    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, T] = {}
        self._lazy: dict[str, str] = {}
        self._resolving = threading.RLock()  # re-entrant: an entry's module may look up others while it imports

    def register(self, name: str, entry: T) -> T:
        if name in self._entries or name in self._lazy:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._entries[name] = entry
        return entry

    def register_lazy(self, name: str, target: str) -> None:
        """Register ``"package.module:attribute"``, imported when ``name`` is first looked up."""
        if name in self._entries or name in self._lazy:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._lazy[name] = target

    def decorator(self, name: str) -> Callable[[T], T]:
        """``@registry.decorator("tile")`` registers the decorated class or function."""
        return lambda entry: self.register(name, entry)

    def get(self, name: str) -> T:
        if name not in self._entries and name in self._lazy:
            with self._resolving:  # threads looking up a lazy entry at once: one imports, the others wait for it
                if name in self._lazy:
                    module, _, attribute = self._lazy[name].partition(":")
                    self._entries[name] = getattr(importlib.import_module(module), attribute)
                    del self._lazy[name]
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(f"unknown {self.what} {name!r}; choose one of: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted({*self._entries, *self._lazy})

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._lazy
