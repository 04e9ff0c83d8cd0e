"""``tunebank tune MODEL --strategy transfer``: transfer-tune every distinct subgraph of a model from the local
database: fit ``encoder`` on the device's profiled subgraphs (deterministic, so the same data gives the same
version and its stored embeddings are reused), embed the model's subgraphs, and run ``transfer_tune`` on each.

    results = transfer_model(database, graph, measurer, backend="cpu", index_dir=dir, encoder="static", k=5)
"""

from dataclasses import dataclass
from pathlib import Path

from db.errors import NotFoundError
from db.index import IndexConfig, VectorIndex
from db.migrate import check_schema
from db.repositories.devices import get_device
from db.session import Database
from embed.encoders import FeatureSet
from embed.ir import Graph
from embed.partition import partition
from service.crawl import baseline, profile_vector
from service.embeddings import embed_subgraphs, fit_encoder, profiled_subgraphs
from service.measure import Measurer
from service.store import static_vector
from service.transfer import TransferResult, transfer_tune
from transforms.tune import make_task


class NoEmbeddingsError(LookupError):
    """The database holds too little for this device to transfer from (nothing crawled yet)."""


@dataclass(frozen=True)
class SubgraphTransfer:
    name: str
    kind: str
    structural_hash: str
    result: TransferResult


def transfer_model(database: Database, graph: Graph, measurer: Measurer, *, backend: str, index_dir: Path,
                   encoder: str = "static", k: int = 5, local_budget: int = 0, per_neighbour: int = 1,
                   fill: bool = True, seed: int = 0) -> list[SubgraphTransfer]:
    """Transfer-tune each distinct tunable subgraph of ``graph`` on the measurer's device. Raises
    ``SchemaOutOfDateError`` for an old schema and ``NoEmbeddingsError`` when the device has nothing crawled."""
    check_schema(database.engine)
    device = measurer.table.device
    hint = "run the crawler (service.crawl) on this device first"
    with database.scope() as session:
        try:
            device_id = get_device(session, device.name).id
        except NotFoundError:
            raise NoEmbeddingsError(f"the database has no subgraphs tuned on device {device.name!r}; {hint}") from None
        ids = profiled_subgraphs(session, device_id)
        if len(ids) < 2:
            raise NoEmbeddingsError(f"the database has {len(ids)} profiled subgraphs on device {device.name!r} "
                                    f"(encoder {encoder!r} needs 2 or more); {hint}")
        fitted = fit_encoder(session, encoder, device_id=device_id, subgraph_ids=ids, backend=backend, seed=seed)
        key = embed_subgraphs(session, fitted, device_id=device_id, subgraph_ids=ids)
    index = VectorIndex.open(database, key, index_dir, IndexConfig("Flat"))
    out = []
    for subgraph in {s.structural_hash: s for s in partition(graph) if s.tunable}.values():
        h = subgraph.structural_hash
        task = make_task(subgraph, seed=seed, name=f"{subgraph.graph.name} ({'+'.join(subgraph.ops)})")
        static = static_vector(subgraph)
        features = FeatureSet(static)
        if fitted.uses_profile:
            features = FeatureSet(static, profile_vector(task, subgraph, baseline(task, h, measurer, backend), device))
        with database.scope() as session:
            result = transfer_tune(task, h, fitted.encode(features)[0], session=session, index=index,
                                   device_id=device_id, measurer=measurer, backend=backend, k=k,
                                   local_budget=local_budget, per_neighbour=per_neighbour, fill=fill, seed=seed)
        out.append(SubgraphTransfer(task.name, task.kind, h, result))
    return out
