"""The settings of ``tunebank serve`` (``TUNEBANK_*``, on top of :class:`tunebank.settings.Settings`), and the plain
config the app gets from them (``service.http.config.ServerConfig``)."""

import ipaddress
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field

from tunebank.settings import Settings


class ServerSettings(Settings):
    rate_limit_per_minute: int = Field(default=600, ge=0, description="requests a minute per API key (0: no limit)")
    request_timeout_s: float = Field(default=120.0, ge=0, description="a request that takes longer ends with 504")
    max_request_bytes: int = Field(default=32 * 2**20, gt=0, description="largest JSON request body (not models)")
    executor: Literal["embedded", "celery", "none"] = Field(
        default="embedded", description="where API jobs run: this process, Celery queues, or `tunebank worker`")
    queue: str = Field(default="", description="Celery queue of jobs that name no device class")
    backend: str = Field(default="auto", description="backend of the embedded executor: auto, cpu or cuda")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) only ever means this machine."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except OSError:
            return False


def server_config(settings: ServerSettings, *, host: str, local_token: str | None = None):  # noqa: ANN201
    """The app's config from ``settings``: open access (no key needed while none exists) only on loopback."""
    from db.index import IndexConfig
    from db.index.vector_index import Metric
    from service.http.config import ServerConfig

    data_dir = Path(settings.data_dir)
    return ServerConfig(
        database_url=settings.resolved_database_url, data_dir=data_dir, index_dir=settings.index_dir,
        index=IndexConfig(settings.index_factory, Metric(settings.index_metric), settings.index_search_params),
        max_model_bytes=settings.max_model_bytes, max_nodes=settings.max_nodes,
        max_tensor_elements=settings.max_tensor_elements, max_request_bytes=settings.max_request_bytes,
        request_timeout_s=settings.request_timeout_s, rate_limit_per_minute=settings.rate_limit_per_minute,
        executor=settings.executor, broker_url=settings.broker_url, default_queue=settings.queue,
        backend=settings.backend, job_lease_s=settings.job_lease_s, open_access=is_loopback(host),
        local_token=local_token,
    )
