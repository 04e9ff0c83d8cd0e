"""``GET /v1/stats``: rows per table, and per device and subgraph kind what is measured and embedded."""

from fastapi import APIRouter

from service.http.auth import ReadKey
from service.http.lookups import stats as coverage
from service.http.state import SessionDep

router = APIRouter(prefix="/v1", tags=["stats"])


@router.get("/stats", operation_id="get_stats")
def stats(_: ReadKey, session: SessionDep) -> dict:
    return coverage(session)
