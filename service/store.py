"""Database writes and reads for tuning and transfer: devices, subgraphs with static features, measurements,
profiled vectors, and the feature rows and transfer pairs encoders learn from.

Profiled vectors are stored in the embeddings table under the pseudo-encoder ``profile`` (version
``embed.profile.PROFILE_VERSION``): one vector per (subgraph, device), like an embedding.
"""

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import Embedding
from db.repositories.devices import DeviceIn, upsert_device
from db.repositories.embeddings import VECTOR_DTYPE, EmbeddingIn, add_embeddings
from db.repositories.measurements import MeasurementIn, ingest_measurements
from db.repositories.rankings import best_recipes, recipe_outcomes
from db.repositories.subgraphs import SubgraphIn, get_subgraphs
from db.repositories.subgraphs import add_subgraphs as add_subgraph_rows
from embed.encoders import FeatureSet, TransferPairs
from embed.features import FEATURE_NAMES, static_features
from embed.ir import graph_from_json
from embed.lower import lower
from embed.profile import PROFILE_VERSION, DeviceSpec
from embed.subgraph import Subgraph
from transforms.adapt import adapt
from transforms.recipe import parse
from transforms.results import RunResult

PROFILE_ENCODER = "profile"
#: Transfer loss (log2 of the slowdown) recorded for a cross-application that failed: as if 32x slower.
FAILED_LOSS = 5.0


def register_device(session: Session, device: DeviceSpec) -> int:
    row = upsert_device(session, DeviceIn(device.name, device.device_class, device.arch,
                                          device.bandwidth_gbps, device.peak_gflops / 1e3))
    return row.id


def static_vector(subgraph: Subgraph) -> np.ndarray:
    return static_features(lower(subgraph.graph), family_hash=subgraph.family_hash).as_array()


def add_subgraphs(session: Session, subgraphs: Sequence[Subgraph]) -> dict[str, int]:
    """Ids by structural hash; new subgraphs are stored with their canonical IR and static features."""
    records = [
        SubgraphIn(s.structural_hash, s.family_hash, s.kind.value, s.graph.model_dump_json(),
                   dict(zip(FEATURE_NAMES, static_vector(s).tolist(), strict=True)))
        for s in {s.structural_hash: s for s in subgraphs}.values()
    ]
    return add_subgraph_rows(session, records)


def add_measurements(
    session: Session, device: DeviceSpec, toolchain: str, subgraph_hash: str, measured: Iterable[tuple[str, RunResult]]
) -> int:
    """Store (canonical recipe, result) pairs of one subgraph; returns how many were new."""
    records = [
        MeasurementIn(subgraph_hash, recipe, device.name, toolchain, r.median_s if r.ok else None,
                      r.iqr_s if r.ok else None, r.repeats, r.ok, r.error_kind)
        for recipe, r in measured
    ]
    return ingest_measurements(session, records).inserted


def add_profiles(session: Session, device_id: int, vectors: Mapping[int, np.ndarray]) -> None:
    """Store profiled vectors by subgraph id."""
    records = [EmbeddingIn(i, device_id, PROFILE_ENCODER, PROFILE_VERSION, v) for i, v in vectors.items()]
    add_embeddings(session, records)


def feature_set(session: Session, device_id: int, subgraph_ids: Sequence[int], *, profiled: bool) -> FeatureSet:
    """Feature rows of ``subgraph_ids`` in that order (profiled vectors from the ``profile`` pseudo-encoder)."""
    rows = get_subgraphs(session, subgraph_ids)
    static = np.array([[rows[i].features[n] for n in FEATURE_NAMES] for i in subgraph_ids], dtype=np.float64)
    if not profiled:
        return FeatureSet(static)
    query = select(Embedding.subgraph_id, Embedding.vector).where(
        Embedding.device_id == device_id, Embedding.encoder == PROFILE_ENCODER,
        Embedding.encoder_version == PROFILE_VERSION, Embedding.subgraph_id.in_(list(subgraph_ids)))
    vectors = {i: np.frombuffer(v, dtype=VECTOR_DTYPE) for i, v in session.execute(query)}
    missing = [i for i in subgraph_ids if i not in vectors]
    if missing:
        raise LookupError(f"subgraph {missing[0]} has no profiled vector on device {device_id}; run its baseline")
    return FeatureSet(static, np.stack([vectors[i] for i in subgraph_ids]).astype(np.float64))


def transfer_pairs(session: Session, device_id: int, subgraph_ids: Sequence[int], backend: str) -> TransferPairs:
    """Measured cross-applications among ``subgraph_ids`` (same kind): for rows a != b, the time of a with b's
    best recipe (adapted to a) over a's best time, as log2; a failed application counts ``FAILED_LOSS``."""
    rows = get_subgraphs(session, subgraph_ids)
    best = best_recipes(session, device_id=device_id, subgraph_ids=subgraph_ids)
    position = {sid: n for n, sid in enumerate(subgraph_ids)}
    outcomes: dict[str, dict[int, float]] = {}

    def time_of(recipe: str, subgraph_id: int) -> float | None:
        if recipe not in outcomes:
            outcomes[recipe] = {o.subgraph_id: (o.median_s if o.ok and o.median_s is not None else math.inf)
                                for o in recipe_outcomes(session, recipe, device_id=device_id)}
        return outcomes[recipe].get(subgraph_id)

    a_rows, b_rows, losses = [], [], []
    for a in subgraph_ids:
        if a not in best:
            continue
        program = lower(graph_from_json(rows[a].ir_json))
        for b in subgraph_ids:
            if b == a or b not in best or rows[b].kind != rows[a].kind:
                continue
            recipe = str(adapt(parse(best[b].recipe), program, backend)[0])
            seconds = time_of(recipe, a)
            if seconds is None:
                continue
            slowdown = seconds / best[a].median_s
            a_rows.append(position[a])
            b_rows.append(position[b])
            losses.append(min(math.log2(slowdown), FAILED_LOSS) if math.isfinite(slowdown) else FAILED_LOSS)
    return TransferPairs(np.array(a_rows), np.array(b_rows), np.array(losses))
