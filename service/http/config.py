"""What the app needs from the settings, as plain values (the entry point reads the settings; the app never does)."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from db.index import IndexConfig

SCOPES = ("read", "optimize", "ingest", "admin")
Executor = Literal["embedded", "celery", "none"]


@dataclass(frozen=True)
class ServerConfig:
    """``executor``: where submitted jobs run: ``embedded`` (a thread of this process, over the jobs table),
    ``celery`` (published to the queue named by the request's device class, or ``default_queue``), ``none`` (left
    in the table for ``tunebank worker`` processes). ``open_access``: requests without a key act as the local user
    while no live key exists (only ever set when the server binds to a loopback address). ``job_options``: defaults
    of every optimize job (a request's own options override them)."""

    database_url: str
    data_dir: Path
    index_dir: Path
    index: IndexConfig = IndexConfig()
    max_model_bytes: int = 512 * 2**20
    max_nodes: int = 20_000
    max_tensor_elements: int = 2**31
    max_request_bytes: int = 32 * 2**20
    request_timeout_s: float = 120.0
    rate_limit_per_minute: int = 600
    executor: Executor = "embedded"
    broker_url: str = "redis://127.0.0.1:6379/0"
    default_queue: str = ""
    backend: str = "auto"
    job_lease_s: float = 60.0
    executor_poll_s: float = 1.0
    open_access: bool = False
    local_token: str | None = None  # tunebank.local()'s secret: it authenticates as the local user
    job_options: dict[str, Any] = field(default_factory=dict)

    @property
    def uploads_dir(self) -> Path:
        return self.data_dir / "uploads"

    @property
    def plans_dir(self) -> Path:
        return self.data_dir / "plans"
