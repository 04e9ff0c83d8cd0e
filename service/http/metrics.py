"""Prometheus metrics of one app (its own registry): requests and latencies by route, and, read from the database
at each scrape, jobs by kind and status, vectors per index (embeddings per device class and encoder version), and
how optimize jobs' subgraphs were served (hit, transfer, not tunable)."""

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from db.models import Device, Embedding, Job
from db.repositories.jobs import JobStatus
from db.session import Database

Scope = dict[str, Any]

class _DatabaseCollector(Collector):
    def __init__(self, database: Database) -> None:
        self.database = database
        self._sources: dict[str, int] = {}
        self._through = 0  # optimize jobs up to this id are counted in _sources
        self._lock = threading.Lock()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily("tunebank_jobs", "jobs in the table by kind and status", labels=["kind", "status"])
        index = GaugeMetricFamily("tunebank_index_vectors", "embeddings per vector index",
                                  labels=["device_class", "encoder", "version"])
        sources = GaugeMetricFamily("tunebank_optimize_subgraphs",
                                    "subgraphs of succeeded optimize jobs by how they were served", labels=["source"])
        with self.database.scope() as session:
            for kind, status, n in session.execute(select(Job.kind, Job.status, func.count())
                                                   .where(~Job.kind.startswith("lock:"))
                                                   .group_by(Job.kind, Job.status)):
                jobs.add_metric([kind, status], n)

            for device_class, encoder, version, n in session.execute(
                    select(Device.device_class, Embedding.encoder, Embedding.encoder_version, func.count())
                    .join(Device, Device.id == Embedding.device_id)
                    .group_by(Device.device_class, Embedding.encoder, Embedding.encoder_version)):
                index.add_metric([device_class, encoder, version], n)
            with self._lock:
                rows = session.execute(select(Job.id, Job.result).where(
                    Job.kind == "optimize", Job.status == JobStatus.SUCCEEDED, Job.id > self._through)
                    .order_by(Job.id)).all()
                for job_id, result in rows:
                    for row in ((result or {}).get("report") or {}).get("subgraphs") or []:
                        source = str(row.get("source", "unknown"))
                        self._sources[source] = self._sources.get(source, 0) + 1
                    self._through = job_id
                for source, n in sorted(self._sources.items()):
                    sources.add_metric([source], n)
        yield from (jobs, index, sources)

class Metrics:
    """The app's registry and its request metrics; ``middleware`` wraps the ASGI app to count requests."""

    def __init__(self, database: Database) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("tunebank_http_requests", "HTTP requests by method, route and status",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("tunebank_http_request_seconds", "HTTP request latency by method and route",
                                 ["method", "route"], registry=self.registry)
        self.registry.register(_DatabaseCollector(database))

    def middleware(self, app: Callable[..., Any]) -> Callable[..., Any]:
        async def wrapped(scope: Scope, receive: Callable, send: Callable) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            started, status = time.perf_counter(), 500

            async def recording(message: dict[str, Any]) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                await send(message)

            try:
                await app(scope, receive, recording)
            finally:
                route = getattr(scope.get("route"), "path", None) or "unmatched"
                self.requests.labels(scope["method"], route, str(status)).inc()
                self.latency.labels(scope["method"], route).observe(time.perf_counter() - started)

        return wrapped
