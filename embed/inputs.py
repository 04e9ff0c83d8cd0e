"""Random inputs for a graph: valid for the ops that read them, never zeros, deterministic per seed.

How an input's use is detected: from each graph input, the readers of the tensor are followed
forward through ops that pass values on unchanged (``identity``, ``cast``, ``reshape``,
``expand``, ``transpose``, ``slice``, ``concat``, the data of ``gather``) to the ops that
constrain it:

* an index of ``gather`` gets integers in ``[0, size of the gathered axis)``; a target of
  ``nll_loss`` integers in ``[0, C)``;
* ``indptr`` and ``indices`` of ``spmm`` get one valid CSR structure (``indptr`` nondecreasing from 0
  to nnz, ``indices`` in ``[0, K)``, sorted and distinct within a row, nonzeros spread at random
  over the rows); its density is nnz / (rows * K), fixed by the graph's shapes;
* a float that reaches (also through ``add``, ``mul``, ``div``, ``maximum``, ``minimum`` and the
  ``reduce_*`` ops, which keep positive values positive) the operand of ``sqrt``, ``rsqrt``,
  ``log``, ``reciprocal``, the base of ``pow``, a divisor, or a ``batch_norm`` variance is drawn
  from ``[0.5, 2)``;
* a weight of ``matmul`` or ``conv2d`` (right operand) is normal with standard deviation
  1/sqrt(fan-in), so products stay near unit scale; other floats are standard normal;
* other integers are drawn from ``[1, 8)``; bools are fair coin flips.

Exact zeros are replaced by 0.5. ``bfloat16`` inputs come back as float32 arrays holding
bfloat16-representable values (numpy has no bfloat16).

With ``xp=cupy`` the floats are drawn on the GPU by the same rules, from a CuPy generator seeded from the
input's NumPy generator, and finished (rule, rounding, zeros) by one kernel (``embed.device_inputs``):
deterministic per (graph, seed), but not the values NumPy draws. Integers and bools
are drawn with NumPy in either case (then uploaded), so index tensors, and whatever is derived from them, are
the same on the host and on the GPU.
"""

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from embed.blocks import BLOCK, blockwise
from embed.errors import EmbedError
from embed.ir import DType, Graph

_PASS_ON = {"identity", "cast", "reshape", "expand", "transpose", "slice", "concat"}
_KEEP_POSITIVE = {"add", "mul", "div", "maximum", "minimum", "reduce_sum", "reduce_mean", "reduce_max", "reduce_min"}
_NEEDS_POSITIVE = {("sqrt", 0), ("rsqrt", 0), ("log", 0), ("reciprocal", 0), ("pow", 0), ("div", 1), ("batch_norm", 2)}
_NUMPY = {
    DType.FLOAT64: np.float64, DType.FLOAT32: np.float32, DType.FLOAT16: np.float16, DType.BFLOAT16: np.float32,
    DType.INT64: np.int64, DType.INT32: np.int32, DType.BOOL: np.bool_,
}


@dataclass
class _Use:
    positive: bool = False
    below: int | None = None  # integers in [0, below)
    fan_in: int | None = None
    csr: tuple[int, int] | None = None  # (spmm node, 0 for indptr | 1 for indices)


def _use(graph: Graph, name: str, consumers: dict[str, list[int]]) -> _Use:
    use = _Use()
    stack = [(name, True)]
    seen: set[tuple[str, bool]] = set()
    while stack:
        tensor, exact = stack.pop()
        if (tensor, exact) in seen:
            continue
        seen.add((tensor, exact))
        for i in consumers[tensor]:
            node = graph.nodes[i]
            for pos in (p for p, t in enumerate(node.inputs) if t == tensor):
                _constrain(graph, i, pos, exact, use)
                if node.op in _PASS_ON or (node.op == "gather" and pos == 0):
                    stack.append((node.outputs[0], exact))
                elif node.op in _KEEP_POSITIVE:
                    stack.append((node.outputs[0], False))
    return use


def _constrain(graph: Graph, i: int, pos: int, exact: bool, use: _Use) -> None:
    node = graph.nodes[i]
    if (node.op, pos) in _NEEDS_POSITIVE:
        use.positive = True
    if not exact:
        return
    first = graph.tensors[node.inputs[0]].shape
    bound = None
    if node.op == "gather" and pos == 1:
        bound = first[node.attrs["axis"] % len(first)]  # type: ignore[operator]
    elif node.op == "nll_loss" and pos == 1:
        bound = first[1]
    elif node.op == "spmm" and pos in (0, 1):
        use.csr = (i, pos)
    elif node.op == "matmul" and pos == 1:
        shape = graph.tensors[node.inputs[1]].shape
        use.fan_in = shape[-1] if node.attrs.get("transpose_b") or len(shape) == 1 else shape[-2]
    elif node.op == "conv2d" and pos == 1:
        use.fan_in = math.prod(graph.tensors[node.inputs[1]].shape[1:])
    if bound is not None:
        use.below = bound if use.below is None else min(use.below, bound)


def _distinct_sorted(rng: np.random.Generator, population: int, count: int) -> np.ndarray:
    """``count`` distinct integers in ``[0, population)``, sorted, in O(count log count)."""
    if count > population // 2:
        return np.setdiff1d(np.arange(population), _distinct_sorted(rng, population, population - count))
    chosen = np.empty(0, dtype=np.int64)
    while len(chosen) < count:
        chosen = np.unique(np.concatenate([chosen, rng.integers(0, population, count - len(chosen))]))
    return chosen


def _csr(graph: Graph, node: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    spmm = graph.nodes[node]
    rows = int(spmm.attrs["rows"])
    k = graph.tensors[spmm.inputs[3]].shape[0]
    nnz = graph.tensors[spmm.inputs[1]].numel
    if nnz > rows * k:
        raise EmbedError(f"spmm node {node}: {nnz} nonzeros do not fit in a {rows} x {k} matrix")
    flat = _distinct_sorted(np.random.default_rng([seed, node, 1]), rows * k, nnz)
    width = max(k, 1)  # k == 0 leaves no nonzeros
    indptr = np.concatenate([[0], np.cumsum(np.bincount(flat // width, minlength=rows))])
    return indptr.astype(np.int64), (flat % width).astype(np.int64)


def _to_bfloat16(a: Any) -> Any:
    bits = a.astype(np.float32, copy=False).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def _finish(out: Any, raw: Any, dtype: DType, use: _Use, spread: np.floating) -> None:
    """``out`` (the input's array, or a block of it) from ``raw`` draws (uniform in [0, 1) for a positive input,
    else standard normal) by ``use``'s rule, rounded to ``dtype``, exact zeros replaced by 0.5."""
    value = 0.5 + 1.5 * raw if use.positive else raw / spread
    out[...] = _to_bfloat16(value) if dtype == DType.BFLOAT16 else value
    out[out == 0] = 0.5


def _floats(rng: np.random.Generator, dtype: DType, use: _Use, shape: tuple[int, ...], xp: Any) -> Any:
    """Float values of ``shape`` and ``dtype`` (bfloat16: float32 holding bfloat16 values) by ``use``'s rule. NumPy
    draws and finishes them block by block (``embed.blocks``), each block by its own generator spawned from
    ``rng``, so the values do not depend on the thread count; another ``xp`` draws them at once with a generator
    seeded from ``rng``."""
    draw = np.float64 if dtype == DType.FLOAT64 else np.float32  # float32 draws are exact below float64, and faster
    spread = draw(math.sqrt(use.fan_in or 1))

    def raw(gen: Any, size: int) -> Any:
        return gen.random(size, dtype=draw) if use.positive else gen.standard_normal(size, dtype=draw)

    out = xp.empty(math.prod(shape), _NUMPY[dtype])
    if xp is not np:
        from embed.device_inputs import finish

        draws = raw(xp.random.default_rng(int(rng.integers(2**63))), out.size)
        finish(out, draws, positive=use.positive, spread=float(spread), bfloat16=dtype == DType.BFLOAT16)
        return out.reshape(shape)
    children = rng.spawn(max(1, -(-out.size // BLOCK)))

    def work(lo: int, hi: int) -> None:
        _finish(out[lo:hi], raw(children[lo // BLOCK], hi - lo), dtype, use, spread)

    blockwise(out.size, work)
    return out.reshape(shape)


def _draw(graph: Graph, name: str, use: _Use, rng: np.random.Generator, seed: int, xp: Any) -> Any:
    tensor = graph.tensors[name]
    shape, dtype = tensor.shape, tensor.dtype
    if dtype.is_float:
        return _floats(rng, dtype, use, shape, xp)
    if dtype == DType.BOOL:
        return rng.random(shape) < 0.5
    if use.csr is not None:
        value = _csr(graph, use.csr[0], seed)[use.csr[1]]
        if value.size != tensor.numel:
            raise EmbedError(f"input {name!r} of spmm has {tensor.numel} elements, expected {value.size}")
        return value.reshape(shape).astype(_NUMPY[dtype])
    if use.below is not None:
        return rng.integers(0, max(use.below, 1), shape).astype(_NUMPY[dtype])
    return rng.integers(1, 8, shape).astype(_NUMPY[dtype])


def random_inputs(graph: Graph, *, seed: int, xp: Any = np, only: Collection[str] | None = None) -> dict[str, Any]:
    """Random arrays of ``xp`` (NumPy, or CuPy: floats drawn on the GPU) for every graph input and param by name,
    or for those named in ``only`` (with the values they get without it); rules in the module docstring."""
    consumers = graph.consumers()
    result = {}
    for k, name in enumerate(graph.inputs):
        if only is None or name in only:
            rng = np.random.default_rng([seed, k])
            result[name] = xp.asarray(_draw(graph, name, _use(graph, name, consumers), rng, seed, xp))
    return result
