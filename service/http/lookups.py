"""What the read routes return: a subgraph with its best recipe per device, and the database's coverage."""

import json
from dataclasses import asdict
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import Device, Measurement, Subgraph
from db.repositories.baselines import eager_times
from db.repositories.rankings import best_recipes
from db.repositories.stats import coverage
from service.http.errors import NotFound, Unprocessable
from service.strict_json import finite

HASH_LENGTH = 64


def find_subgraph(session: Session, ref: str) -> Subgraph:
    """A stored subgraph by row id (digits) or structural hash (64 hex digits)."""
    ref = ref.strip().lower()
    if ref.isdigit() and len(ref) < 19:
        row = session.get(Subgraph, int(ref))
    elif len(ref) == HASH_LENGTH and all(c in "0123456789abcdef" for c in ref):
        row = session.scalar(select(Subgraph).where(Subgraph.structural_hash == ref))
    else:
        raise Unprocessable(f"{ref[:80]!r} is neither a subgraph id nor a structural hash (64 hex digits)")
    if row is None:
        raise NotFound(f"no subgraph {ref[:80]!r} in the database")
    return row


def subgraph_detail(session: Session, ref: str) -> dict[str, Any]:
    """IR, static features, and per device and toolchain the best ok recipe with its time and the eager time."""
    row = find_subgraph(session, ref)
    devices = session.execute(select(Device.id, Device.name, Device.device_class, Measurement.toolchain)
                              .join(Measurement, Measurement.device_id == Device.id)
                              .where(Measurement.subgraph_id == row.id).distinct()
                              .order_by(Device.name, Measurement.toolchain)).all()
    best = []
    for device_id, name, device_class, toolchain in devices:
        timing = best_recipes(session, device_id=device_id, subgraph_ids=[row.id], toolchain=toolchain).get(row.id)
        eager = eager_times(session, device_id=device_id, toolchain=toolchain, subgraph_ids=[row.id]).get(row.id)
        best.append({"device": name, "device_class": device_class, "toolchain": toolchain,
                     "recipe": timing.recipe if timing else None, "median_s": timing.median_s if timing else None,
                     "repeats": timing.repeats if timing else None, "eager_s": eager,
                     "speedup": eager / timing.median_s if timing and eager and timing.median_s else None})
    return finite({"id": row.id, "structural_hash": row.structural_hash, "family_hash": row.family_hash,
                   "kind": row.kind, "ir": json.loads(row.ir_json), "features": row.features, "best": best})


def stats(session: Session) -> dict[str, Any]:
    return finite(asdict(coverage(session)))
