"""Attention as one step: PyTorch's fused scaled dot-product attention in place of the three subgraphs a partition
makes of it (the memory-efficient or flash kernel on cuda, which never writes the scores to memory)::

    S = matmul(Q, K, transpose_b)          a contraction subgraph of one matmul
    P = softmax(S * c + M, last axis)      a reduction subgraph: mul (or div) by constants, at most one add of a
                                           mask after them, then the softmax
    O = matmul(P, V)                       a contraction subgraph of one matmul

is ``O = scaled_dot_product_attention(Q, K, V, attn_mask=M, scale=c)`` when S and P are read by nothing else and
Q, K and V share their batch dimensions. Where M is a weight that holds a causal mask (:func:`causal`: a decoder's
0 on and below the diagonal, a huge negative number above it), the call is ``is_causal=True`` without M: the same
attention, which the fused kernels compute without reading M and skipping the key blocks the mask hides.
:func:`find` lists the attentions of a partition; a plan runs one as an ``attention`` step (``transforms.plan``) at
the output matmul's index, which folds the other two subgraphs. :func:`trial` validates the fused call against a
float64 evaluation and times it like eager subgraphs are timed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from embed.ir import Graph, TensorRole
from embed.subgraph import Subgraph, SubgraphKind
from transforms.run import TOLERANCE

Parts = list[tuple[Subgraph, tuple[int, ...]]]  # embed.partition.partition_nodes(graph)
Env = dict[str, Any]


@dataclass(frozen=True)
class Attention:
    """One attention of a model graph: the indices of its score, softmax and output subgraphs in the partition,
    the model tensors it reads and writes, and the softmax's scale."""

    parts: tuple[int, int, int]
    query: str
    key: str
    value: str
    mask: str | None
    scale: float
    output: str

    @property
    def step(self) -> int:
        """The index of the step that runs it (the output matmul's)."""
        return self.parts[2]

    @property
    def folded(self) -> tuple[int, int]:
        return self.parts[0], self.parts[1]


@dataclass(frozen=True)
class _Flow:
    """Which subgraph of a partition makes each model tensor, and which subgraphs read it."""

    made: dict[str, int]
    readers: dict[str, set[int]]

    @classmethod
    def of(cls, parts: Parts) -> _Flow:
        readers: dict[str, set[int]] = {}
        for n, (s, _) in enumerate(parts):
            for t in s.source_inputs:
                readers.setdefault(t, set()).add(n)
        return cls({t: n for n, (s, _) in enumerate(parts) for t in s.source_outputs}, readers)


def find(graph: Graph, parts: Parts) -> list[Attention]:
    """Every attention of ``graph`` (partitioned into ``parts``), by output subgraph."""
    flow = _Flow.of(parts)
    found = (_match(graph, parts, k, flow) for k in range(len(parts)))
    return [a for a in found if a is not None]


def match(graph: Graph, parts: Parts, k: int) -> Attention | None:
    """The attention whose output matmul is subgraph ``k``, or None."""
    return _match(graph, parts, k, _Flow.of(parts))


def _match(graph: Graph, parts: Parts, k: int, flow: _Flow) -> Attention | None:
    made, readers = flow.made, flow.readers
    out = _single_matmul(parts[k][0], transpose_b=False)
    if out is None:
        return None
    probs, value = out
    r = made.get(probs)
    if r is None:
        return None
    for inner, scores in _outer(parts[r][0]).items():  # the softmax's input that a score matmul computes
        a = made.get(scores)
        score = _single_matmul(parts[a][0], transpose_b=True) if a is not None else None
        softmax = _softmax(parts[r][0], inner) if score is not None else None
        if a is not None and score is not None and softmax is not None:
            break
    else:
        return None
    (query, key), (mask, scale) = score, softmax
    if readers.get(scores) != {r} or readers.get(probs) != {k} or {scores, probs} & set(graph.outputs):
        return None
    q, kk, v = (graph.tensors[t] for t in (query, key, value))
    batch = q.shape[:-2]
    if (len(q.shape) < 3 or kk.shape[:-2] != batch or v.shape[:-2] != batch or kk.shape[-1] != q.shape[-1]
            or v.shape[-2] != kk.shape[-2] or len({q.dtype, kk.dtype, v.dtype}) != 1
            or (mask is not None and graph.tensors[mask].dtype != q.dtype)):
        return None
    return Attention((a, r, k), query, key, value, mask, scale, parts[k][0].source_outputs[0])


def _outer(sub: Subgraph) -> dict[str, str]:
    return dict(zip(sub.graph.inputs, sub.source_inputs, strict=True))


def _single_matmul(sub: Subgraph, *, transpose_b: bool) -> tuple[str, str] | None:
    """The model tensors a subgraph of one matmul (with that ``transpose_b``) multiplies, or None."""
    nodes = sub.graph.nodes
    if sub.kind != SubgraphKind.CONTRACTION or len(nodes) != 1 or nodes[0].op != "matmul" \
            or bool(nodes[0].attrs.get("transpose_b", False)) != transpose_b or len(sub.source_outputs) != 1:
        return None
    outer = _outer(sub)
    a, b = nodes[0].inputs
    return (outer[a], outer[b]) if a in outer and b in outer else None


def _softmax(sub: Subgraph, scores: str) -> tuple[str | None, float] | None:
    """(mask or None, scale) of a subgraph computing ``softmax(scores * scale + mask)`` over the last axis from its
    input ``scores`` (the scaling as muls or divs by one-element constants, the mask added once, after them), or
    None."""
    graph, outer = sub.graph, _outer(sub)
    if len(sub.source_outputs) != 1:
        return None
    *body, last = graph.nodes
    rank = len(graph.tensors[last.inputs[0]].shape)
    if last.op != "softmax" or last.attrs.get("axis") not in (rank - 1, -1):
        return None
    current, mask, scale = scores, None, 1.0
    for node in body:
        others = [t for t in node.inputs if t != current]
        if len(node.inputs) != 2 or len(others) != 1 \
                or graph.tensors[node.outputs[0]].shape != graph.tensors[scores].shape:  # a mask broadcasts, no more
            return None
        other = graph.tensors[others[0]]
        constant = other.role == TensorRole.CONST and other.value is not None and len(other.value) == 1
        if node.op in ("mul", "div") and constant and mask is None and (node.op == "mul" or node.inputs[0] == current):
            scale = scale * other.value[0] if node.op == "mul" else scale / other.value[0]
        elif node.op == "add" and mask is None and others[0] in outer:
            mask = outer[others[0]]
        else:
            return None
        current = node.outputs[0]
    if last.inputs[0] != current or not math.isfinite(scale) or set(graph.inputs) - {scores, *_inner(outer, mask)}:
        return None
    return mask, scale


def _inner(outer: Mapping[str, str], name: str | None) -> list[str]:
    return [inner for inner, o in outer.items() if o == name]


#: Above the diagonal, a causal mask holds -inf, its dtype's lowest value, or at most this: added to a score, it
#: leaves nothing of it after the softmax's exponential (as a decoder's ``full((s, s), -1e9).triu(1)`` does).
MASKED = -1e9


def causal(mask: Any) -> bool:
    """Whether tensor ``mask``, added to the scores, is a causal mask: over its last two dims (queries i, keys j) 0
    where j <= i and masked (:data:`MASKED`) where j > i, with no other dim over 1, so that SDPA's ``is_causal``
    (which aligns the diagonal at the top left) computes the same attention."""
    import torch

    if mask.dim() < 2 or any(n != 1 for n in mask.shape[:-2]) or not mask.dtype.is_floating_point:
        return False
    square = mask.reshape(mask.shape[-2:])
    seen = torch.ones(square.shape, dtype=torch.bool, device=square.device).tril()
    lowest = torch.finfo(square.dtype).min
    hidden = square[~seen]
    return bool((square[seen] == 0).all()) and bool(((hidden <= MASKED) | (hidden == lowest)).all())


def run(attention: Attention, env: Env, *, is_causal: bool = False) -> None:
    """Compute the attention's output from ``env``'s tensors (a plan step); ``is_causal``: its mask is causal
    (:func:`causal`), so the call skips it."""
    import torch

    mask = env[attention.mask] if attention.mask is not None and not is_causal else None
    env[attention.output] = torch.nn.functional.scaled_dot_product_attention(
        env[attention.query], env[attention.key], env[attention.value], attn_mask=mask, scale=attention.scale,
        is_causal=is_causal)


def reference(attention: Attention, env: Env) -> Any:
    """The attention computed as its three subgraphs do (matmul, scaled softmax, matmul), in ``env``'s dtype."""
    import torch

    scores = torch.matmul(env[attention.query], env[attention.key].transpose(-1, -2)) * attention.scale
    if attention.mask is not None:
        scores = scores + env[attention.mask]
    return torch.matmul(torch.softmax(scores, dim=-1), env[attention.value])


@dataclass(frozen=True)
class Trial:
    """The fused call on random inputs: its median seconds (NaN when it did not validate), its error and the
    tolerance it was held to: twice what the three subgraphs' plain evaluation in the inputs' dtype errs, at least the
    dtype's tolerance; errors are max |out - exact| / max |exact| against a float64 evaluation."""

    seconds: float
    error: float
    tolerance: float
    is_causal: bool = False

    @property
    def ok(self) -> bool:
        return math.isfinite(self.seconds)


def trial(attention: Attention, graph: Graph, device: str, *, mask: Any = None, repeats: int = 10,
          seed: int = 0) -> Trial:
    """Validate and time the fused call of ``attention`` on ``device`` (cuda: CUDA-graph replay over input copies
    past L2, as eager subgraphs are timed; cpu: wall clock). Inputs are N(0, 1), the mask U(-1, 1) unless the
    model's own ``mask`` (a tensor: a weight) is given; a causal one (:func:`causal`) is tried as ``is_causal``."""
    import torch

    from embed.eager import TORCH_DTYPES
    from transforms.eager_cuda import graph_replay_seconds

    names = [attention.query, attention.key, attention.value, *([attention.mask] if attention.mask else [])]
    rng = np.random.default_rng(seed)
    inputs = {n: rng.standard_normal(graph.tensors[n].shape) if n != attention.mask
              else rng.uniform(-1, 1, graph.tensors[n].shape) for n in names}
    if attention.mask is not None and mask is not None:
        inputs[attention.mask] = mask.detach().to("cpu", torch.float64).numpy()
    is_causal = mask is not None and causal(mask)
    dtype = TORCH_DTYPES[graph.tensors[attention.query].dtype]
    env = {n: torch.as_tensor(v, device=device, dtype=dtype) for n, v in inputs.items()}
    exact = reference(attention, {n: torch.as_tensor(v, device=device) for n, v in inputs.items()})
    plain = _relative_error(reference(attention, env), exact)
    run(attention, env, is_causal=is_causal)
    error = _relative_error(env[attention.output], exact)
    tolerance = max(TOLERANCE.get(str(dtype).removeprefix("torch."), 1e-4), 2 * plain)
    if not error <= tolerance:
        return Trial(math.nan, error, tolerance, is_causal)

    def step(tensors: Env) -> None:
        run(attention, tensors, is_causal=is_causal)

    if device == "cuda":
        seconds = graph_replay_seconds(step, inputs, dict.fromkeys(names, dtype), repeats=repeats)
    else:
        seconds = _wall_seconds(step, env, repeats)
    return Trial(seconds, error, tolerance, is_causal)


def _relative_error(output: Any, exact: Any) -> float:
    """max |output - exact| / max |exact| (NaN anywhere: inf)."""
    diff = (output.double() - exact).abs().max().item()
    scale = exact.abs().max().item()
    return diff / scale if math.isfinite(diff) and scale > 0 else (0.0 if diff == 0 else math.inf)


def _wall_seconds(step: Callable[[Env], None], env: Mapping[str, Any], repeats: int) -> float:
    tensors = dict(env)
    for _ in range(2):
        step(tensors)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step(tensors)
        times.append(time.perf_counter() - start)
    return float(np.median(times))
