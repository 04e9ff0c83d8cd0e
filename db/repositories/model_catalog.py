"""Models and the ordered list of subgraphs each was cut into."""

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import Model, ModelSubgraph
from db.repositories.subgraphs import subgraph_ids


def add_model(
    session: Session, *, name: str, content_hash: str, subgraph_hashes: Sequence[str], source: str | None = None
) -> Model:
    """The model with ``content_hash``, added with its subgraphs (already stored) in order if it is new."""
    model = session.scalar(select(Model).where(Model.content_hash == content_hash))
    if model is not None:
        return model
    ids = subgraph_ids(session, subgraph_hashes)
    model = Model(name=name, content_hash=content_hash, source=source)
    session.add(model)
    session.flush()
    session.add_all(
        ModelSubgraph(model_id=model.id, position=i, subgraph_id=ids[h]) for i, h in enumerate(subgraph_hashes)
    )
    session.flush()
    return model


def model_subgraph_ids(session: Session, model_id: int) -> list[int]:
    query = select(ModelSubgraph.subgraph_id).where(ModelSubgraph.model_id == model_id).order_by(ModelSubgraph.position)
    return list(session.scalars(query))
