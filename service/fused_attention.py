"""Attention fused or apart, per attention of the model (``transforms.attention``): PyTorch's fused scaled
dot-product attention replaces the score matmul, softmax and output matmul steps when it validates and is faster
than the three as they were chosen (kernel or eager, each as it was timed) by more than ``margin``; it is timed
like the subgraphs were (CUDA-graph replay over input copies past L2 on cuda, wall clock on cpu). An attention whose
steps are not all timed is left apart. Each distinct attention (by its three subgraphs' hashes) is tried once.
"""

from __future__ import annotations

from collections.abc import Sequence

from embed.ir import Graph
from transforms import attention
from transforms.plan import Parts, Step


def fuse_attentions(graph: Graph, parts: Parts, steps: list[Step], seconds: Sequence[float | None], *,
                    backend: str, margin: float, repeats: int = 10, seed: int = 0) -> list[dict[str, object]]:
    """Rewrite ``steps`` (one per part, none folded yet; ``seconds``: what each was timed at) where a fused
    attention wins; one report row per attention found."""
    rows: list[dict[str, object]] = []
    tried: dict[tuple[str, ...], attention.Trial] = {}
    for found in attention.find(graph, parts):
        apart = [seconds[i] for i in found.parts]
        row: dict[str, object] = {"steps": list(found.parts), "apart_s": None, "fused_s": None, "error": None,
                                  "tolerance": None, "choice": "apart"}
        rows.append(row)
        if any(s is None for s in apart):
            continue
        key = tuple(parts[i][0].structural_hash for i in found.parts)
        if key not in tried:
            tried[key] = attention.trial(found, graph, "cuda" if backend == "cuda" else "cpu", repeats=repeats,
                                         seed=seed)
        trial = tried[key]
        total = sum(s for s in apart if s is not None)
        row.update(apart_s=total, fused_s=trial.seconds if trial.ok else None, error=trial.error,
                   tolerance=trial.tolerance)
        if trial.ok and trial.seconds * (1 + margin) < total:
            row["choice"] = "fused"
            a, r, k = found.parts
            steps[a] = Step(steps[a].structural_hash, "folded")
            steps[r] = Step(steps[r].structural_hash, "folded")
            steps[k] = Step(steps[k].structural_hash, "attention", folded=found.folded)
    return rows
