"""``POST /v1/search``: the nearest stored subgraphs (same kind, same device class) of a stored subgraph or of each
distinct tunable subgraph of an IR document, with each neighbour's best recipe on that device class.

The query is embedded with the promoted encoder (the first of learned, static+profiled, static): a stored subgraph
by its stored embedding, else (and an IR's subgraphs always) from its static features, which needs an encoder that
uses no profile (a profile means running the subgraph, which a search never does)."""

import functools
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from db.index import IndexKey
from db.models import Device, Embedding
from db.repositories.rankings import best_recipes
from embed.encoders import Encoder, FeatureSet
from embed.errors import EmbedError
from embed.features import FEATURE_NAMES
from embed.ir import graph_from_json
from embed.partition import partition
from service.embeddings import EncoderStore
from service.http.errors import Conflict, Unprocessable
from service.http.lookups import find_subgraph
from service.http.state import AppState
from service.optimize import ENCODER_PREFERENCE
from service.store import static_vector
from service.strict_json import finite

MAX_QUERIES = 64


def promoted_encoder(state: AppState) -> Encoder:
    """The promoted encoder, read from its file once per version (a version is a digest of its state, so the file
    never changes under it): every search needs it, and reading it on each request was most of a search."""
    directory = state.config.data_dir / "encoders"
    store = EncoderStore(directory)
    for name in ENCODER_PREFERENCE:
        version = store.promoted(name)
        if version:
            with _LOADING:  # one reader of the file: the others wait for it and then find it cached
                return _encoder(directory, name, version)
    raise Conflict("no encoder is promoted yet, so there is nothing to search: crawl or optimize models first")


_LOADING = threading.Lock()


@functools.lru_cache(maxsize=16)
def _encoder(directory: Path, name: str, version: str) -> Encoder:
    return EncoderStore(directory).load(name, version)


def _stored_vector(session: Session, subgraph_id: int, encoder: Encoder, device_class: str) -> np.ndarray | None:
    blob = session.scalar(select(Embedding.vector).join(Device, Device.id == Embedding.device_id).where(
        Embedding.subgraph_id == subgraph_id, Embedding.encoder == encoder.name,
        Embedding.encoder_version == encoder.version, Device.device_class == device_class).limit(1))
    return None if blob is None else np.frombuffer(blob, dtype="<f4")


def _from_static(encoder: Encoder, static: np.ndarray, what: str) -> np.ndarray:
    if encoder.uses_profile:
        raise Unprocessable(f"{what} has no stored embedding, and encoder {encoder.name!r} needs a profile (a run) "
                            "to embed it; optimize the model first, then search by its subgraphs")
    return encoder.encode(FeatureSet(static[None, :]))[0]


def _queries(session: Session, encoder: Encoder, device_class: str, subgraph: str | None,
             ir: dict[str, Any] | None) -> list[tuple[dict[str, Any], str, np.ndarray]]:
    """(what the query is, its kind, its vector) per query subgraph."""
    if subgraph is not None:
        row = find_subgraph(session, subgraph)
        vector = _stored_vector(session, row.id, encoder, device_class)
        if vector is None:
            static = np.array([float(row.features[n]) for n in FEATURE_NAMES]) if row.features else None
            if static is None:
                raise Unprocessable(f"subgraph {row.id} has no stored features")
            vector = _from_static(encoder, static, f"subgraph {row.id}")
        return [({"id": row.id, "structural_hash": row.structural_hash, "kind": row.kind}, row.kind, vector)]
    try:
        graph = graph_from_json(json.dumps(ir))
        found = {s.structural_hash: s for s in partition(graph) if s.tunable}
    except (EmbedError, RecursionError) as e:
        raise Unprocessable(f"the IR document is not a valid graph: {str(e).splitlines()[0][:300]}") from None
    if len(found) > MAX_QUERIES:
        raise Unprocessable(f"the graph has {len(found)} distinct subgraphs; search at most {MAX_QUERIES} at once")
    out = []
    for h, s in found.items():
        what = {"id": None, "structural_hash": h, "kind": s.kind.value, "ops": list(s.ops)}
        out.append((what, s.kind.value, _from_static(encoder, static_vector(s), f"subgraph {h[:12]}")))
    return out


def search(state: AppState, *, subgraph: str | None, ir: dict[str, Any] | None, device_class: str, k: int) -> dict:
    encoder = promoted_encoder(state)
    index = state.index(IndexKey(device_class, encoder.name, encoder.version))
    results = []
    with state.database.scope() as session:
        devices = list(session.scalars(select(Device.id).where(Device.device_class == device_class)))
        for what, kind, vector in _queries(session, encoder, device_class, subgraph, ir):
            found = index.search(session, vector, k + 1, kinds={kind})
            hits = [(row, d) for row, d in zip(found.subgraphs, found.distances, strict=True)
                    if row.structural_hash != what["structural_hash"]][:k]
            best: dict[int, Any] = {}
            for device_id in devices:
                for sid, timing in best_recipes(session, device_id=device_id,
                                                subgraph_ids=[r.id for r, _ in hits]).items():
                    if sid not in best or timing.median_s < best[sid].median_s:
                        best[sid] = timing
            neighbours = [{"id": row.id, "structural_hash": row.structural_hash, "kind": row.kind, "distance": d,
                           "recipe": best[row.id].recipe if row.id in best else None,
                           "median_s": best[row.id].median_s if row.id in best else None} for row, d in hits]
            results.append({"query": what, "neighbours": neighbours})
    return finite({"device_class": device_class, "encoder": encoder.name, "encoder_version": encoder.version,
                   "results": results})
