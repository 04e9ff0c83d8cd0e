"""Static features of a ``LoopProgram``: a fixed-length float vector with documented entries.

Counting conventions (``lg(x)`` is ``log2(1 + x)``):

* iterations of a nest = product of its extents (a ragged dim counts its mean extent);
* a body op runs once per iteration, an epilogue op once per parallel iteration, a sum combiner is
  one add per iteration (an ``fma`` when the body is a product), max/min combiners one compare;
* an access runs once per iteration of the loops down to the innermost dim it depends on (loop
  invariant reads are hoisted); its footprint is min(tensor size, product of the extents of the dims
  it depends on); bytes use the declared dtype's size (float32 = 4), not the evaluator's float64;
* the dominant nest is the one with the most iterations (the first on ties);
* strides are in elements of the row-major tensor, bucketed as ``0`` (invariant), ``1``, ``small``
  (fractional or up to 16), ``large`` (> 16) and ``indirect`` (the dim reaches the index only
  through a value read from memory); a bucket entry is the share of loads, weighted by their nest's
  iterations, among the nests that have that role.

The vector is a pure function of the program: the same program gives the same vector, bit for bit.
The family hash is not computed here (see ``embed.canonical``); callers pass it in.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from embed.loopnest import (
    Access,
    BufferKind,
    Call,
    Combiner,
    LoopNest,
    LoopProgram,
    walk,
)
from embed.ops import OpClass, op_class

_OP_KIND = {
    **dict.fromkeys(("add", "sub", "mul", "neg", "abs"), "addmul"),
    **dict.fromkeys(("div", "reciprocal"), "division"),
    **dict.fromkeys(("maximum", "minimum", "relu", "where"), "compare"),
    **dict.fromkeys(
        ("exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "silu", "erf", "cos", "sin", "gelu", "gelu_tanh", "pow"),
        "transcendental",
    ),
}
_BUCKETS = ("0", "1", "small", "large", "indirect")
_ROLES = ("p0", "p1", "r0", "r1")
_CLASSES = (
    OpClass.POINTWISE, OpClass.REDUCTION, OpClass.CONTRACTION, OpClass.CONVOLUTION, OpClass.SPARSE, OpClass.LAYOUT
)

FEATURES: tuple[tuple[str, str], ...] = (
    ("n_nests", "number of loop nests"),
    ("n_reduction_nests", "nests with reduction dims"),
    ("n_inputs", "input, param and const buffers read"),
    ("n_outputs", "output buffers"),
    ("n_temps", "temporary buffers between nests"),
    ("lg_iterations", "lg of the iterations summed over nests"),
    ("lg_parallel_iterations", "lg of the parallel iterations (elements written) summed over nests"),
    ("lg_reduction_iterations", "lg of the iterations of reduction nests"),
    ("lg_max_reduction_extent", "lg of the largest product of reduction extents of one nest"),
    ("max_parallel_dims", "most parallel dims in one nest"),
    ("max_reduction_dims", "most reduction dims in one nest"),
    ("lg_flops", "lg of all ops: addmul + 2 fma + transcendental + compare + division"),
    ("lg_flops_addmul", "lg of add, sub, mul, neg, abs and sum-combiner adds that are not fma"),
    ("lg_flops_fma", "lg of multiply-adds (sum of a product)"),
    ("lg_flops_transcendental", "lg of exp, log, sqrt, rsqrt, sigmoid, tanh, silu, erf, gelu, cos, sin, pow"),
    ("lg_flops_compare", "lg of maximum, minimum, relu, where and max/min-combiner steps"),
    ("lg_flops_division", "lg of div and reciprocal"),
    ("lg_bytes_accessed", "lg of bytes moved by all accesses, loop-invariant reads hoisted"),
    ("lg_bytes_touched", "lg of bytes of the distinct elements each nest touches, summed over nests"),
    ("lg_min_bytes", "lg of unique input bytes read + output bytes written (temporaries excluded)"),
    ("lg_arithmetic_intensity", "lg of flops / min bytes"),
    ("lg_reuse", "lg of bytes accessed / bytes touched"),
    ("lg_max_load_reuse", "lg of the largest iterations / footprint of one load (e.g. N for matmul's A)"),
    ("lg_extent_p0", "lg of the p0 extent of the dominant nest"),
    ("lg_extent_p1", "lg of the p1 extent of the dominant nest"),
    ("lg_extent_p2", "lg of the product of the p2.. extents of the dominant nest"),
    ("lg_extent_r0", "lg of the r0 extent of the dominant nest"),
    ("lg_extent_r1", "lg of the product of the r1.. extents of the dominant nest"),
    ("lg_contiguous_extent", "lg of the dominant nest's p0 extent when its write stride is 1, else 0"),
    *(
        (f"load_{role}_stride_{bucket}", f"share of loads whose {role} stride is in bucket {bucket}")
        for role in _ROLES
        for bucket in _BUCKETS
    ),
    *((f"store_p0_stride_{bucket}", f"share of writes whose p0 stride is in bucket {bucket}") for bucket in _BUCKETS),
    ("itemsize_in_max", "largest dtype size of an input buffer, bytes"),
    ("itemsize_in_min", "smallest dtype size of an input buffer, bytes"),
    ("itemsize_out_max", "largest dtype size of an output buffer, bytes"),
    *((f"nests_{c.value}", f"nests lowered from {c.value} ops") for c in _CLASSES),
    ("has_indirect", "1 if some index is read from memory (gather, nll_loss, spmm)"),
    ("has_ragged", "1 if some dim has a data-dependent range (CSR rows)"),
    ("has_padding", "1 if some access reads a fill value outside its tensor (padding)"),
)
FEATURE_NAMES: tuple[str, ...] = tuple(name for name, _ in FEATURES)


@dataclass(frozen=True)
class StaticFeatures:
    """The static vector (in ``FEATURE_NAMES`` order) and the family hash the caller passed in."""

    values: tuple[float, ...]
    family_hash: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return FEATURE_NAMES

    def as_array(self) -> np.ndarray:
        return np.asarray(self.values, dtype=np.float64)

    def as_dict(self) -> dict[str, float]:
        return dict(zip(FEATURE_NAMES, self.values, strict=True))


def _lg(x: float) -> float:
    return math.log2(1.0 + x)


def _bucket(stride: float | None) -> str:
    if stride is None:
        return "indirect"
    s = abs(stride)
    if s == 0:
        return "0"
    if s == 1:
        return "1"
    return "small" if s <= 16 else "large"


def _flops(nest: LoopNest) -> dict[str, float]:
    st, iters, par = nest.statement, nest.iterations, nest.parallel_iterations
    out = dict.fromkeys(("addmul", "fma", "transcendental", "compare", "division"), 0.0)
    body_nodes = list(walk(st.body))
    fma = st.combiner == Combiner.SUM and isinstance(st.body, Call) and st.body.op == "mul"
    if fma:
        body_nodes = body_nodes[1:]
        out["fma"] += iters
    elif st.combiner is not None:
        out["addmul" if st.combiner == Combiner.SUM else "compare"] += iters
    for count, nodes in ((iters, body_nodes), (par, list(walk(st.epilogue)) if st.epilogue is not None else [])):
        for node in nodes:
            if isinstance(node, Call):
                out[_OP_KIND[node.op]] += count
    return out


def _executions(nest: LoopNest, access: Access) -> int:
    """Times ``access`` runs with loop-invariant reads hoisted out of the loops it does not use."""
    used = access.dims()
    depth = max((k + 1 for k, d in enumerate(nest.dims) if d.name in used), default=0)
    return math.prod(d.extent for d in nest.dims[:depth])


def _footprint(nest: LoopNest, access: Access, numel: int) -> int:
    used = access.dims()
    return min(numel, math.prod(d.extent for d in nest.dims if d.name in used))


def _nest_accesses(nest: LoopNest) -> list[Access]:
    return [*nest.loads(), nest.statement.write]


def static_features(program: LoopProgram, *, family_hash: str | None = None) -> StaticFeatures:
    """The static feature vector of ``program`` (entries documented in ``FEATURES``)."""
    bufs = program.buffers
    nests = program.nests
    f: dict[str, float] = dict.fromkeys(FEATURE_NAMES, 0.0)
    read = {a.tensor for n in nests for a in n.loads()}
    inputs = [b for b in bufs.values() if b.kind in (BufferKind.INPUT, BufferKind.PARAM, BufferKind.CONST)
              and b.name in read]
    outputs = [b for b in bufs.values() if b.kind == BufferKind.OUTPUT]
    f["n_nests"] = len(nests)
    f["n_reduction_nests"] = sum(1 for n in nests if n.reduction)
    f["n_inputs"], f["n_outputs"] = len(inputs), len(outputs)
    f["n_temps"] = sum(1 for b in bufs.values() if b.kind == BufferKind.TEMP)
    f["lg_iterations"] = _lg(sum(n.iterations for n in nests))
    f["lg_parallel_iterations"] = _lg(sum(n.parallel_iterations for n in nests))
    f["lg_reduction_iterations"] = _lg(sum(n.iterations for n in nests if n.reduction))
    f["lg_max_reduction_extent"] = _lg(max((math.prod(d.extent for d in n.reduction) for n in nests if n.reduction),
                                           default=0))
    f["max_parallel_dims"] = max((len(n.parallel) for n in nests), default=0)
    f["max_reduction_dims"] = max((len(n.reduction) for n in nests), default=0)

    flops = dict.fromkeys(("addmul", "fma", "transcendental", "compare", "division"), 0.0)
    for n in nests:
        for k, v in _flops(n).items():
            flops[k] += v
    total_flops = flops["addmul"] + 2 * flops["fma"] + flops["transcendental"] + flops["compare"] + flops["division"]
    f["lg_flops"] = _lg(total_flops)
    for k, v in flops.items():
        f[f"lg_flops_{k}"] = _lg(v)

    accessed = touched = 0.0
    max_reuse = 0.0
    input_elements: dict[str, int] = {}
    for n in nests:
        per_tensor: dict[str, int] = {}
        for a in _nest_accesses(n):
            buf = bufs[a.tensor]
            accessed += _executions(n, a) * buf.dtype.itemsize
            fp = _footprint(n, a, buf.numel)
            per_tensor[a.tensor] = max(per_tensor.get(a.tensor, 0), fp)
            if a is not n.statement.write and fp:
                max_reuse = max(max_reuse, n.iterations / fp)
        for t, fp in per_tensor.items():
            touched += fp * bufs[t].dtype.itemsize
            input_elements[t] = input_elements.get(t, 0) + fp
    min_bytes = sum(min(b.numel, input_elements.get(b.name, 0)) * b.dtype.itemsize for b in inputs)
    min_bytes += sum(b.nbytes for b in outputs)
    f["lg_bytes_accessed"], f["lg_bytes_touched"], f["lg_min_bytes"] = _lg(accessed), _lg(touched), _lg(min_bytes)
    f["lg_arithmetic_intensity"] = _lg(total_flops / min_bytes) if min_bytes else 0.0
    f["lg_reuse"] = _lg(accessed / touched) if touched else 0.0
    f["lg_max_load_reuse"] = _lg(max_reuse)

    if nests:
        dom = max(nests, key=lambda n: n.iterations)
        par, red = dom.parallel[::-1], dom.reduction[::-1]  # inner -> outer
        f["lg_extent_p0"] = _lg(par[0].extent) if par else 0.0
        f["lg_extent_p1"] = _lg(par[1].extent) if len(par) > 1 else 0.0
        f["lg_extent_p2"] = _lg(math.prod(d.extent for d in par[2:])) if len(par) > 2 else 0.0
        f["lg_extent_r0"] = _lg(red[0].extent) if red else 0.0
        f["lg_extent_r1"] = _lg(math.prod(d.extent for d in red[1:])) if len(red) > 1 else 0.0
        write = dom.statement.write
        if par and write.stride("p0", bufs[write.tensor].shape) == 1:
            f["lg_contiguous_extent"] = _lg(par[0].extent)

    _stride_shares(f, program)
    f["itemsize_in_max"] = max((b.dtype.itemsize for b in inputs), default=0)
    f["itemsize_in_min"] = min((b.dtype.itemsize for b in inputs), default=0)
    f["itemsize_out_max"] = max((b.dtype.itemsize for b in outputs), default=0)
    for n in nests:
        cls = op_class(n.op)
        if cls in _CLASSES:
            f[f"nests_{cls.value}"] += 1
    f["has_indirect"] = float(any(_has_indirect(n) for n in nests))
    f["has_ragged"] = float(any(d.ragged is not None for n in nests for d in n.dims))
    f["has_padding"] = float(any(a.fill is not None for n in nests for a in n.loads()))
    return StaticFeatures(tuple(float(f[name]) for name in FEATURE_NAMES), family_hash)


def _has_indirect(nest: LoopNest) -> bool:
    return any(next(e.indirects(), None) is not None for a in _nest_accesses(nest) for e in a.index)


def _stride_shares(f: dict[str, float], program: LoopProgram) -> None:
    weights: dict[tuple[str, str], float] = {}
    totals: dict[str, float] = {}

    def add(prefix: str, role: str, accesses: Iterable[Access], nest: LoopNest) -> None:
        for a in accesses:
            bucket = _bucket(a.stride(role, program.buffers[a.tensor].shape))
            weights[(f"{prefix}_{role}", bucket)] = weights.get((f"{prefix}_{role}", bucket), 0.0) + nest.iterations
            totals[f"{prefix}_{role}"] = totals.get(f"{prefix}_{role}", 0.0) + nest.iterations

    for n in program.nests:
        roles = {d.name for d in n.dims}
        for role in _ROLES:
            if role in roles:
                add("load", role, n.loads(), n)
        if "p0" in roles:
            add("store", "p0", [n.statement.write], n)
    for (key, bucket), w in weights.items():
        f[f"{key}_stride_{bucket}"] = w / totals[key] if totals[key] else 0.0  # zero-size dims: no iterations

