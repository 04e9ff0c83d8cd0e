"""Attention fused or apart, per attention of the model (``transforms.attention``): PyTorch's fused scaled
dot-product attention replaces the score matmul, softmax and output matmul steps when it validates and is faster
than the three as they were chosen (kernel or eager, each as it was timed) by more than ``margin``; it is timed
like the subgraphs were (CUDA-graph replay over input copies past L2 on cuda, wall clock on cpu). An attention whose
steps are not all timed is left apart. Where the mask is a weight holding a causal mask (``attention.causal``), the
fused call is tried with ``is_causal`` (a plan checks the weights it is bound to again). Each distinct attention (by
its three subgraphs' hashes) is tried once, and its trial is stored as a measurement of the three subgraphs merged,
under the recipe :data:`ATTENTION` (:data:`CAUSAL`): a later optimize on this device reuses it, so with every
subgraph a hit it decides as the run before did.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from embed.ir import Graph
from service.measurement_store import MeasurementStore
from transforms import attention
from transforms.plan import Parts, Step, step_subgraph
from transforms.results import RunResult

#: The recipe texts a fused attention's trial is stored under (a measurement of its three subgraphs merged): with
#: the mask given, and causal without it.
ATTENTION, CAUSAL = "attention(sdpa)", "attention(sdpa,causal)"


def fuse_attentions(graph: Graph, parts: Parts, steps: list[Step], seconds: Sequence[float | None],
                    store: MeasurementStore, *, backend: str, margin: float, params: Mapping[str, Any] | None = None,
                    repeats: int = 10, seed: int = 0) -> list[dict[str, object]]:
    """Rewrite ``steps`` (one per part, none folded yet; ``seconds``: what each was timed at) where a fused
    attention wins; ``params``: the model's weights (tensors) when known. One report row per attention found
    (``causal``: tried with ``is_causal``; ``stored``: its trial was an earlier run's)."""
    rows: list[dict[str, object]] = []
    tried: dict[tuple[object, ...], tuple[attention.Trial | None, bool]] = {}
    for found in attention.find(graph, parts):
        apart = [seconds[i] for i in found.parts]
        mask = (params or {}).get(found.mask) if found.mask is not None else None
        is_causal = mask is not None and attention.causal(mask)
        row: dict[str, object] = {"steps": list(found.parts), "apart_s": None, "fused_s": None, "error": None,
                                  "tolerance": None, "causal": is_causal, "stored": False, "choice": "apart"}
        rows.append(row)
        if any(s is None for s in apart):
            continue
        key = (*(parts[i][0].structural_hash for i in found.parts), is_causal)
        if key not in tried:
            tried[key] = _trial(found, graph, parts, store, backend, mask if is_causal else None, repeats, seed)
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
           causal_mask: Any, repeats: int, seed: int) -> tuple[attention.Trial | None, bool]:
    """(the attention's trial, causal when the model's causal mask is given, whether it was stored before); the
    trial is None for a stored failure."""
    merged = step_subgraph(graph, parts, found.step, found.folded)
    recipe = ATTENTION if causal_mask is None else CAUSAL
    stored = store.results(merged).get(recipe)
    if stored is not None:
        return (attention.Trial(stored, math.nan, math.nan) if isinstance(stored, float) else None), True
    trial = attention.trial(found, graph, "cuda" if backend == "cuda" else "cpu", mask=causal_mask, repeats=repeats,
                            seed=seed)
    result = (RunResult(ok=True, median_s=trial.seconds, min_s=trial.seconds, repeats=repeats, max_rel_err=trial.error)
              if trial.ok else RunResult.failure("wrong", f"the fused attention errs {trial.error:.3g}, over its "
                                                          f"tolerance {trial.tolerance:.3g}", trial.error))
    store.add(merged.structural_hash, [(recipe, result)])
    return trial, False
