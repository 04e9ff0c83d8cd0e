"""Attention fused or apart, per attention of the model (``transforms.attention``): PyTorch's fused scaled
dot-product attention replaces the score matmul, softmax and output matmul steps when it validates and is faster
than the three as they were chosen (kernel or eager, each as it was timed) by more than ``margin``; it is timed
like the subgraphs were (CUDA-graph replay over input copies past L2 on cuda, wall clock on cpu). An attention whose
steps are not all timed is left apart. Each distinct attention (by its three subgraphs' hashes) is tried once, and
its trial is stored as a measurement of the three subgraphs merged, under the recipe :data:`ATTENTION`: a later
optimize on this device reuses it, so with every subgraph a hit it decides as the run before did.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from embed.ir import Graph
from service.measurement_store import MeasurementStore
from transforms import attention
from transforms.plan import Parts, Step, step_subgraph
from transforms.results import RunResult

#: The recipe text a fused attention's trial is stored under (a measurement of its three subgraphs merged).
ATTENTION = "attention(sdpa)"


def fuse_attentions(graph: Graph, parts: Parts, steps: list[Step], seconds: Sequence[float | None],
                    store: MeasurementStore, *, backend: str, margin: float, repeats: int = 10,
                    seed: int = 0) -> list[dict[str, object]]:
    """Rewrite ``steps`` (one per part, none folded yet; ``seconds``: what each was timed at) where a fused
    attention wins; one report row per attention found (``stored``: its trial was an earlier run's)."""
    rows: list[dict[str, object]] = []
    tried: dict[tuple[str, ...], tuple[attention.Trial | None, bool]] = {}
    for found in attention.find(graph, parts):
        apart = [seconds[i] for i in found.parts]
        row: dict[str, object] = {"steps": list(found.parts), "apart_s": None, "fused_s": None, "error": None,
                                  "tolerance": None, "stored": False, "choice": "apart"}
        rows.append(row)
        if any(s is None for s in apart):
            continue
        key = tuple(parts[i][0].structural_hash for i in found.parts)
        if key not in tried:
            tried[key] = _trial(found, graph, parts, store, backend, repeats, seed)
        trial, stored = tried[key]
        total = sum(s for s in apart if s is not None)
        fused = trial.seconds if trial is not None and trial.ok else None
        row.update(apart_s=total, fused_s=fused, stored=stored)
        if trial is not None and not stored:
            row.update(error=trial.error, tolerance=trial.tolerance)
        if fused is not None and fused * (1 + margin) < total:
            row["choice"] = "fused"
            a, r, k = found.parts
            steps[a] = Step(steps[a].structural_hash, "folded")
            steps[r] = Step(steps[r].structural_hash, "folded")
            steps[k] = Step(steps[k].structural_hash, "attention", folded=found.folded)
    return rows


def _trial(found: attention.Attention, graph: Graph, parts: Parts, store: MeasurementStore, backend: str,
           repeats: int, seed: int) -> tuple[attention.Trial | None, bool]:
    """(the attention's trial, whether it was stored before); the trial is None for a stored failure."""
    merged = step_subgraph(graph, parts, found.step, found.folded)
    stored = store.results(merged).get(ATTENTION)
    if stored is not None:
        return (attention.Trial(stored, math.nan, math.nan) if isinstance(stored, float) else None), True
    trial = attention.trial(found, graph, "cuda" if backend == "cuda" else "cpu", repeats=repeats, seed=seed)
    result = (RunResult(ok=True, median_s=trial.seconds, min_s=trial.seconds, repeats=repeats, max_rel_err=trial.error)
              if trial.ok else RunResult.failure("wrong", f"the fused attention errs {trial.error:.3g}, over its "
                                                          f"tolerance {trial.tolerance:.3g}", trial.error))
    store.add(merged.structural_hash, [(ATTENTION, result)])
    return trial, False
