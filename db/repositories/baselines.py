"""Eager baselines per subgraph, device and toolchain, and the crawler's demand queue."""

from collections.abc import Collection

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import Baseline, Demand


def eager_times(session: Session, *, device_id: int, toolchain: str,
                subgraph_ids: Collection[int]) -> dict[int, float | None]:
    """Stored eager seconds by subgraph id (None: eager cannot run it there); subgraphs without one are absent."""
    query = select(Baseline.subgraph_id, Baseline.eager_s).where(
        Baseline.device_id == device_id, Baseline.toolchain == toolchain, Baseline.subgraph_id.in_(list(subgraph_ids)))
    return {subgraph_id: eager_s for subgraph_id, eager_s in session.execute(query)}


def set_eager_time(session: Session, *, subgraph_id: int, device_id: int, toolchain: str,
                   eager_s: float | None) -> None:
    """Store (or replace) one subgraph's eager time."""
    row = session.scalar(select(Baseline).where(Baseline.subgraph_id == subgraph_id, Baseline.device_id == device_id,
                                                Baseline.toolchain == toolchain))
    if row is None:
        session.add(Baseline(subgraph_id=subgraph_id, device_id=device_id, toolchain=toolchain, eager_s=eager_s))
    else:
        row.eager_s = eager_s
    session.flush()


def request_crawl(session: Session, *, subgraph_id: int, device_id: int, distance: float | None) -> Demand:
    """Queue a subgraph for the crawler (or count one more request for it, reopening it if it was crawled)."""
    row = session.scalar(select(Demand).where(Demand.subgraph_id == subgraph_id, Demand.device_id == device_id))
    if row is None:
        row = Demand(subgraph_id=subgraph_id, device_id=device_id, distance=distance, requests=1, status="open")
        session.add(row)
    else:
        row.requests += 1
        row.distance = distance
        row.status = "open"
    session.flush()
    return row


def open_demand(session: Session, *, device_id: int, limit: int = 1000) -> list[Demand]:
    """Open requests on a device, most requested first."""
    query = (select(Demand).where(Demand.device_id == device_id, Demand.status == "open")
             .order_by(Demand.requests.desc(), Demand.id).limit(limit))
    return list(session.scalars(query))
