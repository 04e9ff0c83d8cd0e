"""Bulk, idempotent ingest of measurements keyed by (subgraph, recipe, device, toolchain).

The same measurement sent twice is stored once (the first one wins): rows go in with
``INSERT ... ON CONFLICT DO NOTHING`` on the key, so concurrent writers never duplicate or lose rows.
"""

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.errors import InvalidRecordError
from db.models import Device, Measurement
from db.repositories._insert import insert_ignore_count, pages
from db.repositories.recipes import ensure_recipes
from db.repositories.subgraphs import subgraph_ids

KEY = ("subgraph_id", "recipe_id", "device_id", "toolchain")
COLUMNS = (*KEY, "median_s", "spread_s", "repeats", "ok", "error_kind", "job_id", "measured_at")


@dataclass(frozen=True)
class MeasurementIn:
    """One timing, named by natural keys: subgraph structural hash, canonical recipe string, device name."""

    subgraph: str
    recipe: str
    device: str
    toolchain: str
    median_s: float | None
    spread_s: float | None = None
    repeats: int = 0
    ok: bool = True
    error_kind: str | None = None
    job_id: int | None = None
    measured_at: dt.datetime | None = None

    def __post_init__(self) -> None:
        if self.ok and (self.error_kind is not None or self.median_s is None):
            raise InvalidRecordError(f"measurement of {self.recipe!r}: an ok measurement needs a median and no error")
        if not self.ok and not self.error_kind:
            raise InvalidRecordError(f"measurement of {self.recipe!r}: a failed measurement needs an error_kind")
        for name in ("median_s", "spread_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise InvalidRecordError(f"measurement of {self.recipe!r}: {name} must be finite and >= 0, got {value}")
        if self.repeats < 0:
            raise InvalidRecordError(f"measurement of {self.recipe!r}: repeats must be >= 0, got {self.repeats}")


_FIELDS = {f.name for f in fields(MeasurementIn)}


@dataclass(frozen=True)
class IngestResult:
    received: int
    inserted: int

    @property
    def duplicates(self) -> int:
        return self.received - self.inserted


def as_measurement(record: MeasurementIn | Mapping[str, Any]) -> MeasurementIn:
    """Accept a ``MeasurementIn`` or a dict with its fields; unknown or missing fields are an ``InvalidRecordError``."""
    if isinstance(record, MeasurementIn):
        return record
    unknown = set(record) - _FIELDS
    if unknown:
        raise InvalidRecordError(f"unknown measurement field(s): {', '.join(sorted(unknown))}")
    try:
        return MeasurementIn(**record)
    except TypeError as e:
        raise InvalidRecordError(f"bad measurement record: {e}") from None


def ingest_measurements(session: Session, records: Iterable[MeasurementIn | Mapping[str, Any]]) -> IngestResult:
    """Store new measurements and skip those already stored. Subgraphs and devices must exist; recipes are added."""
    batch = [as_measurement(r) for r in records]
    if not batch:
        return IngestResult(0, 0)
    recipes = ensure_recipes(session, (m.recipe for m in batch))
    subgraphs = subgraph_ids(session, (m.subgraph for m in batch))
    devices = _device_ids(session, {m.device for m in batch})
    now = dt.datetime.now(dt.UTC)
    rows = [
        (subgraphs[m.subgraph], recipes[m.recipe], devices[m.device], m.toolchain, m.median_s, m.spread_s, m.repeats,
         m.ok, m.error_kind, m.job_id, m.measured_at or now)
        for m in batch
    ]  # fmt: skip
    return IngestResult(len(batch), insert_ignore_count(session, Measurement.__table__, KEY, COLUMNS, rows))


def _device_ids(session: Session, names: set[str]) -> dict[str, int]:
    ids: dict[str, int] = {}
    for page in pages(sorted(names)):
        ids.update(session.execute(select(Device.name, Device.id).where(Device.name.in_(page))).all())
    missing = sorted(names - set(ids))
    if missing:
        raise InvalidRecordError(f"unknown device {missing[0]!r}; register it first")
    return ids
