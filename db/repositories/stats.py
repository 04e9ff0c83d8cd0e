"""Coverage: rows per table, and per device and per subgraph kind what is measured and embedded."""

from dataclasses import dataclass

from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session

from db.models import (
    ApiKey,
    Base,
    Baseline,
    Demand,
    Device,
    Embedding,
    Job,
    Measurement,
    Model,
    ModelSubgraph,
    Recipe,
    Subgraph,
)


@dataclass(frozen=True)
class DeviceCoverage:
    device: str
    device_class: str
    measurements: int
    ok_measurements: int
    subgraphs_measured: int
    embeddings: int


@dataclass(frozen=True)
class KindCoverage:
    kind: str
    subgraphs: int
    subgraphs_with_ok_measurement: int
    measurements: int


@dataclass(frozen=True)
class Coverage:
    tables: dict[str, int]
    devices: list[DeviceCoverage]
    kinds: list[KindCoverage]


TABLES: tuple[type[Base], ...] = (Device, Model, Subgraph, ModelSubgraph, Recipe, Measurement, Baseline, Embedding,
                                  Demand, Job, ApiKey)


def coverage(session: Session) -> Coverage:
    tables = {m.__tablename__: session.scalar(select(func.count()).select_from(m)) or 0 for m in TABLES}
    measured = (
        select(
            Measurement.device_id,
            func.count().label("n"),
            func.count().filter(Measurement.ok).label("ok"),
            func.count(distinct(Measurement.subgraph_id)).label("subgraphs"),
        )
        .group_by(Measurement.device_id)
        .subquery()
    )
    embedded = select(Embedding.device_id, func.count().label("n")).group_by(Embedding.device_id).subquery()
    device_rows = session.execute(
        select(
            Device.name,
            Device.device_class,
            func.coalesce(measured.c.n, 0),
            func.coalesce(measured.c.ok, 0),
            func.coalesce(measured.c.subgraphs, 0),
            func.coalesce(embedded.c.n, 0),
        )
        .outerjoin(measured, measured.c.device_id == Device.id)
        .outerjoin(embedded, embedded.c.device_id == Device.id)
        .order_by(Device.name)
    )
    per_subgraph = (
        select(Measurement.subgraph_id, func.count().label("n"), func.count().filter(Measurement.ok).label("ok"))
        .group_by(Measurement.subgraph_id)
        .subquery()
    )
    kind_rows = session.execute(
        select(
            Subgraph.kind,
            func.count(),
            func.count().filter(per_subgraph.c.ok > 0),
            func.coalesce(func.sum(per_subgraph.c.n), 0),
        )
        .outerjoin(per_subgraph, per_subgraph.c.subgraph_id == Subgraph.id)
        .group_by(Subgraph.kind)
        .order_by(Subgraph.kind)
    )
    return Coverage(
        tables=tables,
        devices=[DeviceCoverage(*row) for row in device_rows],
        kinds=[KindCoverage(kind, int(n), int(ok), int(m)) for kind, n, ok, m in kind_rows],  # sum() is Decimal on PG
    )
