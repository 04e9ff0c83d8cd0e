"""The reference evaluator of a ``LoopProgram``: every generated kernel is checked against it.

Floating-point buffers are computed in float64 whatever their declared dtype (or float32 when asked: what
checking low-precision outputs needs, at half the cost); integer buffers stay int64 and bool buffers bool.
Evaluation is vectorised: each nest is a grid with one array axis per dimension, every value is an array that is
size 1 along the dims it does not depend on, loads are strided views (affine; a padded access views a padded copy)
or gathers (indirect, ragged), reductions are array reductions over the reduction axes, and ``sum(a * b)`` is one
batched ``matmul`` (BLAS), so a matmul never materialises its M x N x K grid. A ragged dimension spans the
longest range and is masked to each row's own range. A large nest runs in chunks of its outermost parallel dim
(disjoint rows), on threads with NumPy, one after the other on a GPU.

The array module ``xp`` is NumPy (special functions from SciPy) or CuPy (CUDA's own, as element-wise kernels): the
same code evaluates on the host or on the GPU.
"""

import functools
import importlib
import math
import os
from collections.abc import Callable, Generator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from embed.errors import EmbedError
from embed.ir import DType
from embed.loopnest import (
    Acc,
    Access,
    Affine,
    BufferKind,
    Call,
    Cast,
    Combiner,
    Const,
    DimKind,
    Expr,
    FloorDiv,
    Load,
    LoopNest,
    LoopProgram,
    Mod,
    index_range,
    without_splits,
)


class EvaluationError(EmbedError):
    """Inputs do not fit the program: missing, mis-shaped, or an index read from data is out of range."""


_SQRT1_2 = math.sqrt(0.5)
_SQRT_2_PI = math.sqrt(2.0 / math.pi)


def _special(xp: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``(expit, erf)`` in array module ``xp``: SciPy's on the host; on the GPU CUDA's own ``erf`` and
    ``1 / (1 + exp(-x))`` as CuPy element-wise kernels, what ``cupyx.scipy.special`` compiles too, without its
    import (it imports SciPy's sparse matrices: 0.2-1 s of a worker's start on an H200 machine)."""
    if xp is np:
        special = importlib.import_module("scipy.special")
        return special.expit, special.erf
    return (xp.ElementwiseKernel("T x", "T y", "y = 1 / (1 + exp(-x))", "reference_expit"),
            xp.ElementwiseKernel("T x", "T y", "y = erf(x)", "reference_erf"))


@functools.cache
def _operations(xp: Any) -> dict[str, Callable[..., Any]]:
    """The element-wise ops of ``Call`` nodes in array module ``xp`` (NumPy or CuPy)."""
    expit, erf = _special(xp)
    return {
        "neg": xp.negative,
        "exp": xp.exp,
        "log": xp.log,
        "sqrt": xp.sqrt,
        "rsqrt": lambda x: 1.0 / xp.sqrt(x),
        "relu": lambda x: xp.maximum(x, 0),
        "sigmoid": expit,
        "tanh": xp.tanh,
        "silu": lambda x: x * expit(x),
        "abs": xp.abs,
        "reciprocal": lambda x: 1.0 / x,
        "erf": erf,
        "cos": xp.cos,
        "sin": xp.sin,
        "gelu": lambda x: 0.5 * x * (1.0 + erf(x * _SQRT1_2)),
        "gelu_tanh": lambda x: 0.5 * x * (1.0 + xp.tanh(_SQRT_2_PI * (x + 0.044715 * x * x * x))),
        "add": xp.add,
        "sub": xp.subtract,
        "mul": xp.multiply,
        "div": xp.true_divide,
        "pow": xp.power,
        "maximum": xp.maximum,
        "minimum": xp.minimum,
        "where": lambda c, a, b: xp.where(c.astype(bool), a, b),
    }


_REDUCE = {Combiner.SUM: "sum", Combiner.MAX: "max", Combiner.MIN: "min"}  # array-module function names
_CHUNK = 1 << 23  # elements (64 MiB of float64) a nest evaluates at once, split along its outermost dim


def numpy_dtype(dtype: DType, float_dtype: type[np.floating] = np.float64) -> type[np.generic]:
    """The evaluator's dtype for a buffer of ``dtype``: ``float_dtype``, int64 or bool."""
    if dtype.is_float:
        return float_dtype
    return np.bool_ if dtype == DType.BOOL else np.int64


def evaluate(program: LoopProgram, inputs: Mapping[str, Any], float_dtype: type[np.floating] = np.float64,
             xp: Any = np) -> dict[str, Any]:
    """Run ``program`` on ``inputs`` (name -> array of the buffer's shape) and return its outputs, floats
    computed in ``float_dtype`` (float64 or float32); inputs and outputs are arrays of ``xp`` (NumPy, or CuPy to
    evaluate on the GPU)."""
    env = _environment(program, inputs, float_dtype, xp)
    for nest in program.nests:
        _run_nest(nest, env, xp)
    return _outputs(program, env)


def evaluate_steps(program: LoopProgram, inputs: Mapping[str, Any], float_dtype: type[np.floating] = np.float64,
                   xp: Any = np) -> Generator[None, None, dict[str, Any]]:
    """:func:`evaluate` a nest at a time: yields after each nest (on a GPU, its kernels queued) and returns the
    outputs, so a caller can do other work between nests."""
    env = _environment(program, inputs, float_dtype, xp)
    for nest in program.nests:
        _run_nest(nest, env, xp)
        yield
    return _outputs(program, env)


def _environment(program: LoopProgram, inputs: Mapping[str, Any], float_dtype: type[np.floating],
                 xp: Any) -> dict[str, Any]:
    """Every buffer of ``program`` by name: the inputs checked and converted, constants, the rest unwritten."""
    env: dict[str, Any] = {}
    for buf in program.buffers.values():
        dtype = numpy_dtype(buf.dtype, float_dtype)
        if buf.kind in (BufferKind.INPUT, BufferKind.PARAM):
            if buf.name not in inputs:
                raise EvaluationError(f"missing input {buf.name!r} (expected shape {list(buf.shape)})")
            arr = xp.asarray(inputs[buf.name])
            if arr.shape != buf.shape:
                raise EvaluationError(f"input {buf.name!r} has shape {list(arr.shape)}, expected {list(buf.shape)}")
            env[buf.name] = xp.ascontiguousarray(arr, dtype=dtype)
        elif buf.kind == BufferKind.CONST:
            env[buf.name] = xp.asarray(np.asarray(buf.value, dtype=np.float64).astype(dtype).reshape(buf.shape))
        else:
            env[buf.name] = xp.full(buf.shape, np.nan, dtype) if dtype is float_dtype else xp.zeros(buf.shape, dtype)
    return env


def _run_nest(nest: LoopNest, env: dict[str, Any], xp: Any) -> None:
    pad_cache: dict[tuple, Any] = {}

    def run(rows: range | None) -> None:
        with np.errstate(all="ignore"):  # per thread
            _NestEval(nest, env, pad_cache, rows, xp).run()

    chunks = _row_chunks(nest)
    if len(chunks) == 1 or xp is not np:
        for rows in chunks:  # one GPU runs the chunks' kernels in turn
            run(rows)
        return
    with ThreadPoolExecutor(max_workers=min(len(chunks), os.cpu_count() or 1)) as pool:
        list(pool.map(run, chunks))  # disjoint rows of the same buffers; NumPy releases the GIL in its loops


def _outputs(program: LoopProgram, env: Mapping[str, Any]) -> dict[str, Any]:
    return {
        name: env[name] if program.buffers[name].kind == BufferKind.OUTPUT else env[name].copy()
        for name in program.outputs
    }


def _row_chunks(nest: LoopNest) -> list[range | None]:
    """Ranges of the outermost parallel dim that keep each evaluation step near ``_CHUNK`` elements."""
    st = nest.statement
    if st.combiner == Combiner.SUM and isinstance(st.body, Call) and st.body.op == "mul":
        loads = [math.prod(d.extent for d in nest.dims if d.name in a.dims()) for a in nest.loads()]
        size = max([nest.parallel_iterations, *loads])
    else:
        size = nest.iterations
    if size <= _CHUNK or not nest.dims or nest.dims[0].kind != DimKind.PARALLEL:
        return [None]
    extent = nest.dims[0].extent
    step = max(1, extent * _CHUNK // size)
    return [range(lo, min(lo + step, extent)) for lo in range(0, extent, step)]


def _along(values: Any, axis: int, nd: int) -> Any:
    return values.reshape([-1 if k == axis else 1 for k in range(nd)])


class _NestEval:
    """One nest on a grid with one axis per dimension (outer -> inner); ``rows`` limits the outermost."""

    def __init__(
        self, nest: LoopNest, env: dict[str, Any], pad_cache: dict[tuple, Any], rows: range | None, xp: Any
    ) -> None:
        self.nest, self.env, self.pad_cache, self.xp = nest, env, pad_cache, xp
        self.nd = len(nest.dims)
        self.axis = {d.name: k for k, d in enumerate(nest.dims)}
        self.dense = {d.name for d in nest.dims if d.ragged is None}
        self.shape = [d.extent for d in nest.dims]
        self.first = [0] * self.nd
        if rows is not None:
            self.first[0], self.shape[0] = rows.start, len(rows)
        self.values: dict[str, Any] = {}
        self.mask: Any = None
        self.memo: dict[Expr, Any] = {}
        self.acc: Any = None
        for k, d in enumerate(nest.dims):
            if d.ragged is None:
                self.values[d.name] = _along(xp.arange(self.first[k], self.first[k] + self.shape[k]), k, self.nd)
                continue
            start, stop = self.index(d.ragged.start), self.index(d.ragged.stop)
            span = stop - start
            if (span < 0).any():
                raise EvaluationError(f"ragged range of {d.name} in {nest.op} ends before it starts (bad indptr?)")
            self.shape[k] = int(span.max()) if span.size else 0
            offset = _along(xp.arange(self.shape[k]), k, self.nd)
            self.values[d.name] = start + offset
            inside = offset < span
            self.mask = inside if self.mask is None else self.mask & inside
        self.empty = math.prod(self.shape) == 0

    def run(self) -> None:
        st = self.nest.statement
        if any(self.shape[k] == 0 for k, d in enumerate(self.nest.dims) if d.kind == DimKind.PARALLEL):
            return
        if st.combiner is None:
            value = self.expr(st.body)
        else:
            value = self.reduce(st.body, st.combiner)
            if st.epilogue is not None:
                self.acc = value
                value = self.expr(st.epilogue)
        self.write(st.write, value)

    # -- index expressions -------------------------------------------------------------------

    def index(self, expr: Affine) -> Any:
        out = self.xp.full((1,) * self.nd, expr.const, dtype=np.int64)
        for atom, coef in expr.terms:
            if isinstance(atom, str):
                value = self.values[atom]
            elif isinstance(atom, FloorDiv):
                value = self.index(atom.arg) // atom.divisor
            elif isinstance(atom, Mod):
                value = self.index(atom.arg) % atom.modulus
            else:
                value = self.gather(atom.tensor, [self.index(e) for e in atom.index], None)
                if value.dtype.kind not in "iub":
                    raise EvaluationError(f"index tensor {atom.tensor!r} holds non-integer values")
                value = value.astype(np.int64)
            out = out + coef * value
        return out

    # -- loads and stores --------------------------------------------------------------------

    def gather(self, tensor: str, index: list[Any], fill: float | None) -> Any:
        xp, arr = self.xp, self.env[tensor]
        if not index:
            return arr.reshape((1,) * self.nd)
        index = xp.broadcast_arrays(*index)
        inside = xp.ones(index[0].shape, dtype=bool)
        for i, n in zip(index, arr.shape, strict=True):
            inside &= (i >= 0) & (i < n)
        if fill is None:
            bad = ~inside if self.mask is None else ~inside & self.mask
            if bad.any():
                raise EvaluationError(f"index out of range reading {tensor!r} of shape {list(arr.shape)}")
        if arr.size == 0:
            return xp.full(inside.shape, np.nan if fill is None else fill)
        values = arr[tuple(xp.clip(i, 0, n - 1) for i, n in zip(index, arr.shape, strict=True))]
        return values if fill is None else xp.where(inside, values, fill)

    def strided(self, access: Access, writeable: bool = False) -> Any:
        """A zero-copy view of an affine access over the grid, or None if it is not one.

        A padded access (``fill``) views a copy of the tensor padded with ``fill`` as far as the grid reaches.
        """
        arr = self.env[access.tensor]
        if self.empty:
            return None
        if any(not isinstance(a, str) or a not in self.dense for e in access.index for a, _ in e.terms):
            return self.reshaped(access, writeable)
        ranges = [self.range(e) for e in access.index]
        pads = tuple((max(0, -lo), max(0, hi - n + 1)) for (lo, hi), n in zip(ranges, arr.shape, strict=True))
        if any(before or after for before, after in pads):
            if access.fill is None:
                return None
            arr = self.padded(access.tensor, pads, access.fill)
        shape, strides, offset = [1] * self.nd, [0] * self.nd, 0
        for e, (before, _), step in zip(access.index, pads, arr.strides, strict=True):
            offset += (e.const + before) * step
            for atom, coef in e.terms:
                k = self.axis[atom]  # type: ignore[index]
                shape[k], strides[k] = self.shape[k], strides[k] + coef * step
                offset += coef * self.first[k] * step
        if min(strides, default=0) < 0:
            return None
        return self.view(arr, shape, strides, offset, writeable)

    def view(self, arr: Any, shape: list[int], strides: list[int], offset: int, writeable: bool) -> Any:
        """``arr``'s memory from byte ``offset`` on, viewed with ``shape`` and byte ``strides``."""
        base = arr.reshape(-1)[offset // max(arr.itemsize, 1):]
        if self.xp is np:
            return as_strided(base, shape, strides, writeable=writeable)
        return self.xp.lib.stride_tricks.as_strided(base, shape, strides)  # CuPy's views are always writeable

    def reshaped(self, access: Access, writeable: bool = False) -> Any:
        """A zero-copy view of an access through a reshape's index map (digits of a flat index, ``//`` and ``%``,
        merged again in the tensor's offset: ``without_splits``), in bounds; None for any other access."""
        arr = self.env[access.tensor]
        extents = {d.name: d.extent for d in self.nest.dims if d.ragged is None}
        ranges = [index_range(e, extents) for e in access.index]
        if any(r is None or r[0] < 0 or r[1] >= n for r, n in zip(ranges, arr.shape, strict=True)):
            return None
        offset = without_splits(sum((e * (step // arr.itemsize) for e, step in zip(access.index, arr.strides,
                                                                                     strict=True)), Affine()))
        if any(not isinstance(a, str) or a not in self.dense or c < 0 for a, c in offset.terms):
            return None
        shape, strides, start = [1] * self.nd, [0] * self.nd, offset.const
        for atom, coef in offset.terms:
            k = self.axis[atom]  # type: ignore[index]
            shape[k], strides[k] = self.shape[k], coef * arr.itemsize
            start += coef * self.first[k]
        return self.view(arr, shape, strides, start * arr.itemsize, writeable)

    def range(self, expr: Affine) -> tuple[int, int]:
        """Inclusive [min, max] of an affine index over this grid."""
        lo = hi = expr.const
        for atom, coef in expr.terms:
            k = self.axis[atom]  # type: ignore[index]
            ends = (coef * self.first[k], coef * (self.first[k] + self.shape[k] - 1))
            lo, hi = lo + min(ends), hi + max(ends)
        return lo, hi

    def padded(self, tensor: str, pads: tuple[tuple[int, int], ...], fill: float) -> Any:
        key = (tensor, pads, fill)
        if key not in self.pad_cache:
            self.pad_cache[key] = self.xp.pad(self.env[tensor], pads, constant_values=fill)
        return self.pad_cache[key]

    def load(self, access: Access) -> Any:
        view = self.strided(access)
        if view is not None:
            return view
        return self.gather(access.tensor, [self.index(e) for e in access.index], access.fill)

    def write(self, access: Access, value: Any) -> None:
        view = self.strided(access, writeable=True)
        if view is not None:
            view[...] = value
            return
        *index, value = self.xp.broadcast_arrays(*[self.index(e) for e in access.index], value)
        self.env[access.tensor][tuple(index)] = value

    # -- compute -----------------------------------------------------------------------------

    def expr(self, expr: Expr) -> Any:
        if isinstance(expr, Acc):
            assert self.acc is not None
            return self.acc
        cached = self.memo.get(expr)
        if cached is not None:
            return cached
        if isinstance(expr, Load):
            value = self.load(expr.access)
        elif isinstance(expr, Const):
            value = self.xp.full((1,) * self.nd, expr.value)
        elif isinstance(expr, Call):
            value = self.xp.asarray(_operations(self.xp)[expr.op](*(self.expr(a) for a in expr.args)))
        else:
            value = _cast(self.expr(expr.arg), expr.dtype, self.xp)
        if not _has_acc(expr):
            self.memo[expr] = value
        return value

    def reduce(self, body: Expr, combiner: Combiner) -> Any:
        xp = self.xp
        red = tuple(k for k, d in enumerate(self.nest.dims) if d.kind == DimKind.REDUCTION)
        if combiner == Combiner.SUM and isinstance(body, Call) and body.op == "mul":
            return self.contract(body, red)
        value = self.expr(body)
        full = [self.shape[k] if k in red else n for k, n in enumerate(value.shape)]
        value = xp.broadcast_to(value, full)
        if self.mask is not None:
            value = xp.where(self.mask, value, combiner.identity)
        if value.size == 0:
            return xp.full([1 if k in red else n for k, n in enumerate(value.shape)], combiner.identity)
        return getattr(xp, _REDUCE[combiner])(value, axis=red, keepdims=True)

    def contract(self, body: Call, red: tuple[int, ...]) -> Any:
        """``sum over red of a * b`` as one batched matmul over the axes each operand really has."""
        xp = self.xp
        a, b = (self.expr(x) for x in body.args)
        if self.mask is not None:
            a, b = xp.where(self.mask, a, 0), xp.where(self.mask, b, 0)
        has_a = {k for k in range(self.nd) if a.shape[k] != 1}
        has_b = {k for k in range(self.nd) if b.shape[k] != 1}
        absent = math.prod(self.shape[k] for k in red if k not in has_a | has_b)
        own_a, own_b = tuple(sorted(has_a - has_b & set(red))), tuple(sorted(has_b - has_a & set(red)))
        a = a.sum(axis=own_a, keepdims=True) if own_a else a
        b = b.sum(axis=own_b, keepdims=True) if own_b else b
        both = sorted(has_a & has_b)
        batch, inner = [k for k in both if k not in red], [k for k in both if k in red]
        rows, cols = sorted(has_a - has_b - set(own_a)), sorted(has_b - has_a - set(own_b))
        product = xp.matmul(self.pack(a, [batch, rows, inner]), self.pack(b, [batch, inner, cols]))
        if absent != 1:
            product = product * absent
        axes = batch + rows + cols
        product = product.reshape([self.shape[k] for k in axes]).transpose([int(k) for k in np.argsort(axes)])
        return product.reshape([self.shape[k] if k in axes else 1 for k in range(self.nd)])

    def pack(self, x: Any, groups: list[list[int]]) -> Any:
        """``x`` with its axes regrouped (each group flattened, size-1 axes dropped) into a 3-D array."""
        order = [k for g in groups for k in g]
        x = x.transpose(order + [k for k in range(self.nd) if k not in order])
        return x.reshape([math.prod(self.shape[k] for k in g) for g in groups])


def _has_acc(expr: Expr) -> bool:
    if isinstance(expr, Acc):
        return True
    if isinstance(expr, Call):
        return any(_has_acc(a) for a in expr.args)
    return isinstance(expr, Cast) and _has_acc(expr.arg)


def _cast(value: Any, dtype: DType, xp: Any) -> Any:
    if dtype.is_float:
        return value if value.dtype.kind == "f" else value.astype(np.float64)
    if dtype == DType.BOOL:
        return value != 0
    return (xp.trunc(value) if value.dtype.kind == "f" else value).astype(np.int64)
