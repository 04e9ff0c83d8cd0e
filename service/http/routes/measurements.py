"""``POST /v1/measurements``: bulk ingest from remote crawlers. Idempotent: a measurement is keyed by subgraph,
recipe, device and toolchain, and one already stored is skipped (the first one wins)."""

import datetime as dt
from typing import Annotated

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from db.repositories.devices import DeviceIn, upsert_device
from db.repositories.measurements import MeasurementIn, ingest_measurements
from service.http.auth import IngestKey
from service.http.errors import Unprocessable
from service.http.state import StateDep
from transforms.recipe import RecipeError, parse

router = APIRouter(prefix="/v1", tags=["ingest"])
MAX_RECORDS = 50_000


class DeviceBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    device_class: str = Field(min_length=1, max_length=100)
    arch: str = Field(min_length=1, max_length=100)
    bandwidth_gbps: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    peak_tflops: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class MeasurementBody(BaseModel):
    """One timing, by natural keys: the subgraph's structural hash (stored already), the canonical recipe, the
    device name (stored already, or in this request's ``devices``) and the toolchain."""

    model_config = ConfigDict(extra="forbid")
    subgraph: str = Field(min_length=64, max_length=64, pattern="^[0-9a-f]{64}$")
    recipe: str = Field(min_length=1, max_length=2000)
    device: str = Field(min_length=1, max_length=200)
    toolchain: str = Field(min_length=1, max_length=200)
    median_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    spread_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    repeats: int = Field(default=0, ge=0, le=2**31 - 1)
    ok: bool = True
    error_kind: str | None = Field(default=None, max_length=50)
    measured_at: dt.datetime | None = None


class IngestRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    devices: list[DeviceBody] = Field(default_factory=list, max_length=1000)
    measurements: Annotated[list[MeasurementBody], Field(max_length=MAX_RECORDS)]


@router.post("/measurements", operation_id="ingest_measurements")
def ingest(body: IngestRequest, _: IngestKey, state: StateDep) -> dict:
    """Store new measurements (and register or update ``devices``); returns how many were new."""
    records = [MeasurementIn(**{**m.model_dump(), "recipe": _canonical(m.recipe, n)})
               for n, m in enumerate(body.measurements)]
    with state.database.scope() as session:
        for d in body.devices:
            upsert_device(session, DeviceIn(d.name, d.device_class, d.arch, d.bandwidth_gbps, d.peak_tflops))
        result = ingest_measurements(session, records)
    return {"received": result.received, "inserted": result.inserted, "duplicates": result.duplicates}


def _canonical(recipe: str, n: int) -> str:
    """The recipe's canonical string (so the same recipe written two ways is one row); 422 when it does not parse."""
    try:
        return str(parse(recipe))
    except RecipeError as e:
        raise Unprocessable(f"measurements[{n}]: recipe {recipe[:80]!r} does not parse: {str(e)[:200]}") from None
