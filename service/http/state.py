"""What the routes share, built once by the app: the database, the config, the rate limiter, the job submitter, the
open vector indexes, and this server's device (detected on first use)."""

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from db.index import IndexKey, VectorIndex
from db.session import Database
from service.http.config import ServerConfig
from service.http.ratelimit import RateLimiter


@dataclass(frozen=True)
class Target:
    """Where the embedded executor tunes: backend, device class and compiler toolchain."""

    backend: str
    device_class: str
    toolchain: str


@dataclass
class AppState:
    config: ServerConfig
    database: Database
    limiter: RateLimiter
    celery: Any = None  # a Celery app when config.executor == "celery"
    last_used: dict[int, float] = field(default_factory=dict)
    _target: Target | None = None
    _indexes: dict[IndexKey, VectorIndex] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    submitting: threading.Lock = field(default_factory=threading.Lock)  # one job submission at a time

    def target(self) -> Target:
        """This machine's backend, device class and toolchain (the device is measured once, on first use)."""
        with self._lock:
            if self._target is None:
                from service.devices import detect_device, toolchain
                from transforms.backends import resolve_backend

                backend = resolve_backend(self.config.backend)
                self._target = Target(backend, detect_device(backend).device_class, toolchain(backend))
            return self._target

    def index(self, key: IndexKey) -> VectorIndex:
        """The vector index of ``key``, opened once and synced with the database on each call."""
        with self._lock:
            index = self._indexes.get(key)
            if index is None:
                index = self._indexes[key] = VectorIndex.open(self.database, key, self.config.index_dir,
                                                              self.config.index)
                return index
        index.sync()
        return index

    def index_sizes(self) -> dict[IndexKey, int]:
        with self._lock:
            return {k: i.ntotal for k, i in self._indexes.items()}


def get_state(request: Request) -> AppState:
    return request.app.state.tunebank


def get_session(state: Annotated[AppState, Depends(get_state)]) -> Iterator[Session]:
    with state.database.scope() as session:
        yield session


StateDep = Annotated[AppState, Depends(get_state)]
SessionDep = Annotated[Session, Depends(get_session)]
