"""The crawl's last step: train a new learned encoder when enough new profiled subgraphs arrived since the last one,
promote it only when it is no worse than the promoted encoder on held-out subgraphs, and embed every profiled
subgraph with the promoted versions (so searches find what the crawl added).

The held-out check: every fifth profiled subgraph is held out; the candidate is fitted on the rest; for each held-out
subgraph its nearest same-kind training subgraph (by embedding distance, among those whose best recipe was
cross-applied to it) gives a transfer loss, log2(time with the neighbour's best recipe / own best time). The
candidate is promoted when its mean loss is no larger than the promoted encoder's (or, with none promoted, the
static encoder's fitted on the same training subgraphs).
"""

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import Embedding, Job
from db.models import Subgraph as SubgraphRow
from db.repositories.jobs import JobStatus
from db.session import Database
from embed.encoders import Encoder, EncoderError, encoders
from service.embeddings import EncoderStore, embed_subgraphs, fit_encoder, profiled_subgraphs
from service.jobs import JobProgress
from service.store import feature_set, transfer_pairs

log = logging.getLogger(__name__)

LEARNED = "learned"
HOLD_OUT_EVERY = 5


def last_trained_on(session: Session) -> int:
    """How many profiled subgraphs the last encoder a crawl promoted was trained on (0: none yet)."""
    results = session.scalars(select(Job.result).where(Job.kind == "crawl", Job.status == JobStatus.SUCCEEDED)
                              .order_by(Job.id.desc()))
    for result in results:
        promoted = ((result or {}).get("encoder") or {}).get("trained_on")
        if promoted is not None:
            return int(promoted)
    return 0


def held_out_loss(session: Session, encoder: Encoder, *, device_id: int, ids: Sequence[int], held: Sequence[int],
                  losses: dict[tuple[int, int], float]) -> tuple[float, int]:
    """Mean transfer loss of each held-out subgraph from its nearest training neighbour, and how many counted."""
    vectors = encoder.encode(feature_set(session, device_id, ids, profiled=encoder.uses_profile))
    position = {sid: n for n, sid in enumerate(ids)}
    kinds = dict(session.execute(select(SubgraphRow.id, SubgraphRow.kind).where(SubgraphRow.id.in_(list(ids)))).all())
    held_set = set(held)
    found = []
    for a in held:
        near = [b for b in ids if b not in held_set and kinds[b] == kinds[a] and (a, b) in losses]
        if near:
            b = min(near, key=lambda b: float(np.linalg.norm(vectors[position[a]] - vectors[position[b]])))
            found.append(losses[(a, b)])
    return (float(np.mean(found)) if found else float("nan")), len(found)


def decide(session: Session, store: EncoderStore, *, device_id: int, backend: str, retrain_min: int,
           seed: int) -> dict[str, Any]:
    """Whether to train and promote, with the figures that decided it."""
    ids = profiled_subgraphs(session, device_id)
    trained_on = last_trained_on(session)
    figures: dict[str, Any] = {"profiled": len(ids), "new": len(ids) - trained_on, "promote": False}
    if len(ids) - trained_on < retrain_min:
        return {**figures, "reason": f"{len(ids) - trained_on} new profiled subgraphs, fewer than {retrain_min}"}
    held = ids[::HOLD_OUT_EVERY]
    train = [i for i in ids if i not in set(held)]
    pairs = transfer_pairs(session, device_id, ids, backend)
    losses = {(ids[a], ids[b]): float(v) for a, b, v in zip(pairs.a, pairs.b, pairs.loss, strict=True)}
    try:
        candidate = fit_encoder(session, LEARNED, device_id=device_id, subgraph_ids=train, backend=backend, seed=seed)
    except EncoderError as e:
        return {**figures, "reason": f"cannot train: {e}"}
    promoted = store.promoted(LEARNED)
    reference = (store.load(LEARNED, promoted) if promoted else
                 fit_encoder(session, "static", device_id=device_id, subgraph_ids=train, backend=backend))
    new_loss, n = held_out_loss(session, candidate, device_id=device_id, ids=ids, held=held, losses=losses)
    old_loss, _ = held_out_loss(session, reference, device_id=device_id, ids=ids, held=held, losses=losses)
    figures.update(held_out=len(held), held_out_pairs=n, candidate_loss=new_loss, reference_loss=old_loss,
                   reference=f"{LEARNED} {promoted}" if promoted else "static (no learned version promoted)")
    if n == 0:
        return {**figures, "reason": "no held-out subgraph has a cross-applied neighbour"}
    if not new_loss <= old_loss:
        return {**figures, "reason": f"held-out loss {new_loss:.3f} > {old_loss:.3f}: not promoted"}
    return {**figures, "promote": True, "reason": f"held-out loss {new_loss:.3f} <= {old_loss:.3f}"}


def embed_missing(session: Session, store: EncoderStore, *, device_id: int) -> dict[str, int]:
    """Embed the profiled subgraphs that the promoted version of each encoder has not embedded yet."""
    ids = profiled_subgraphs(session, device_id)
    added = {}
    for name in encoders.names():
        version = store.promoted(name)
        if version is None:
            continue
        have = set(session.scalars(select(Embedding.subgraph_id).where(
            Embedding.device_id == device_id, Embedding.encoder == name, Embedding.encoder_version == version)))
        missing = [i for i in ids if i not in have]
        if missing:
            embed_subgraphs(session, store.load(name, version), device_id=device_id, subgraph_ids=missing)
        added[name] = len(missing)
    return added


def encoder_step(database: Database, store: EncoderStore, *, device_id: int, backend: str, retrain_min: int,
                 seed: int, progress: JobProgress, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Decide (once per crawl: the decision is checkpointed), train and promote, embed; the decision's figures."""
    decision = checkpoint.get("encoder")
    if decision is None:
        progress(progress.fraction, "encoder: deciding")
        with database.scope() as session:
            decision = decide(session, store, device_id=device_id, backend=backend, retrain_min=retrain_min,
                              seed=seed)
            progress.save({**checkpoint, "encoder": decision}, session)
    log.info("encoder: %s", decision["reason"])
    progress(progress.fraction, "encoder: training and promoting" if decision["promote"] else "encoder: embedding")
    with database.scope() as session:
        if decision["promote"]:
            ids = profiled_subgraphs(session, device_id)[: decision["profiled"]]
            fitted = fit_encoder(session, LEARNED, device_id=device_id, subgraph_ids=ids, backend=backend, seed=seed)
            store.save(fitted)
            embed_subgraphs(session, fitted, device_id=device_id, subgraph_ids=ids)
            store.promote(LEARNED, fitted.version)
            decision = {**decision, "version": fitted.version, "trained_on": len(ids)}
        embedded = embed_missing(session, store, device_id=device_id)
    return {**decision, "embedded": embedded}
