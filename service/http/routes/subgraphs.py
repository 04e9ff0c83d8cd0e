"""``GET /v1/subgraphs/{id}`` and ``POST /v1/search``."""

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.http.auth import ReadKey
from service.http.errors import Unprocessable
from service.http.lookups import subgraph_detail
from service.http.search import search as search_neighbours
from service.http.state import SessionDep, StateDep

router = APIRouter(prefix="/v1", tags=["subgraphs"])


@router.get("/subgraphs/{ref}", operation_id="get_subgraph")
def get_subgraph(ref: str, _: ReadKey, session: SessionDep) -> dict:
    """A stored subgraph by id or structural hash: its IR, static features, and best recipe per device."""
    return subgraph_detail(session, ref)


class SearchRequest(BaseModel):
    """Give ``subgraph`` (a stored id or structural hash) or ``ir`` (a graph document: each of its distinct tunable
    subgraphs is a query)."""

    model_config = ConfigDict(extra="forbid")
    subgraph: str | None = Field(default=None, max_length=80)
    ir: dict[str, Any] | None = None
    device_class: str | None = Field(default=None, max_length=200, description="default: the server's")
    k: Annotated[int, Field(ge=1, le=100)] = 5

    @model_validator(mode="after")
    def _one_query(self) -> "SearchRequest":
        if (self.subgraph is None) == (self.ir is None):
            raise ValueError("give exactly one of 'subgraph' and 'ir'")
        return self


@router.post("/search", operation_id="search")
def search(body: SearchRequest, _: ReadKey, state: StateDep) -> dict:
    """The k nearest stored subgraphs of the same kind on a device class, with their best recipes."""
    device_class = body.device_class
    if device_class is None:
        if state.config.executor == "celery":
            raise Unprocessable("name a device_class: this server does not tune on a device of its own")
        device_class = state.target().device_class
    return search_neighbours(state, subgraph=body.subgraph, ir=body.ir, device_class=device_class, k=body.k)
