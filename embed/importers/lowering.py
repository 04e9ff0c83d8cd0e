"""What both importers share: a ``Lowering`` that maps source tensors onto IR tensors, and the composite
patterns (linear, gather, cross-entropy, attention) written once so that the ONNX and PyTorch routes
produce the same IR for the same model.
"""

import math
from collections.abc import Sequence

import numpy as np
from pydantic import ValidationError

from embed.builder import GraphBuilder
from embed.errors import ModelImportError
from embed.importers.normalize import normalize
from embed.ir import MAX_CONST_ELEMENTS, DType, Graph

Shape = tuple[int, ...]


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (pydantic errors: the first error's message)."""
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        return f"{where}: {msg}" if where else msg
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def rounded(value: float, dtype: DType) -> float:
    """``value`` as the nearest number representable in ``dtype`` (so equal constants hash equally)."""
    if not dtype.is_float:
        return float(int(value)) if dtype != DType.BOOL else float(bool(value))
    if math.isinf(value):  # keep documents JSON-safe: -inf masks become the lowest finite value
        value = math.copysign(float(np.finfo(np.float32).max), value)
    if dtype == DType.FLOAT16:
        return float(np.float16(value))
    if dtype == DType.BFLOAT16:
        bits = int(np.float32(value).view(np.uint32))
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return float(np.uint32(bits).view(np.float32))
    return float(np.float32(value)) if dtype == DType.FLOAT32 else float(value)


def axis_in(axis: int, rank: int, what: str = "axis") -> int:
    """``axis`` in ``[0, rank)``, counting from the end when negative; out of ``[-rank, rank)`` it is refused, never
    wrapped."""
    if not -max(rank, 1) <= axis < max(rank, 1):
        raise ModelImportError(f"{what} {axis} is out of range for rank {rank}")
    return axis % max(rank, 1)


def broadcast(*shapes: Shape) -> Shape:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ModelImportError(f"shapes {[list(s) for s in shapes]} do not broadcast") from None


def matmul_shape(a: Shape, b: Shape, transpose_b: bool) -> Shape:
    m, k = a[-2:]
    k2, n = (b[-1], b[-2]) if transpose_b else b[-2:]
    if k != k2:
        raise ModelImportError(f"matmul of {list(a)} and {list(b)} (transpose_b={transpose_b}) has mismatched K")
    return (*broadcast(a[:-2], b[:-2]), m, n)


class Lowering:
    """An IR graph under construction plus the source-name -> IR-name map of one import."""

    def __init__(self, name: str) -> None:
        self.builder = GraphBuilder(name[:256])
        self.env: dict[str, str] = {}
        self._suffix: dict[str, int] = {}  # base name -> last suffix tried: names sharing a prefix stay linear

    def shape(self, tensor: str) -> Shape:
        return self.builder.tensors[tensor].shape

    def dtype(self, tensor: str) -> DType:
        return self.builder.tensors[tensor].dtype

    def const(self, values: float | Sequence[float], dtype: DType, shape: Shape = ()) -> str:
        flat = [values] if isinstance(values, (int, float)) else list(values)
        return self.builder.const([rounded(float(v), dtype) for v in flat], dtype, shape)

    def array(self, value: np.ndarray, dtype: DType, name: str) -> str:
        """A known array: a CONST when small, else a PARAM named ``name`` (values are not kept)."""
        if value.size <= MAX_CONST_ELEMENTS:
            return self.const(value.reshape(-1).tolist(), dtype, value.shape)
        return self.builder.param(self.fresh_name(name), value.shape, dtype)

    def fresh_name(self, name: str) -> str:
        name = name[:250] or "t"
        candidate, i = name, self._suffix.get(name, 0)
        while candidate in self.builder.tensors:
            i += 1
            candidate = f"{name}_{i}"
        self._suffix[name] = i
        return candidate

    def emit(self, op: str, inputs: Sequence[str], shape: Shape, dtype: DType, /, **attrs: object) -> str:
        return self.builder.node(op, inputs, shape, dtype, **attrs)  # type: ignore[arg-type]

    def opaque(self, name: str, inputs: Sequence[str], outputs: Sequence[tuple[Shape, DType]]) -> list[str]:
        return self.builder.opaque(name, list(dict.fromkeys(inputs)), outputs)

    def binary(self, op: str, a: str, b: str) -> str:
        return self.emit(op, [a, b], broadcast(self.shape(a), self.shape(b)), self.dtype(a))

    def reshape(self, x: str, shape: Shape) -> str:
        if self.shape(x) == tuple(shape):
            return x
        return self.emit("reshape", [x], shape, self.dtype(x), shape=list(shape))

    def transpose(self, x: str, perm: Sequence[int]) -> str:
        if sorted(perm) != list(range(len(self.shape(x)))):
            raise ModelImportError(f"perm {list(perm)[:16]} is not a permutation of the {len(self.shape(x))} axes")
        if list(perm) == list(range(len(perm))):
            return x
        shape = tuple(self.shape(x)[p] for p in perm)
        return self.emit("transpose", [x], shape, self.dtype(x), perm=list(perm))

    def matmul(self, a: str, b: str, *, transpose_b: bool = False) -> str:
        shape = matmul_shape(self.shape(a), self.shape(b), transpose_b)
        return self.emit("matmul", [a, b], shape, self.dtype(a), transpose_b=transpose_b)

    def linear(self, x: str, weight: str, bias: str | None) -> str:
        """``x @ weight.T + bias``: matmul(transpose_b=True) then add, in both importers."""
        y = self.matmul(x, weight, transpose_b=True)
        return self.binary("add", y, bias) if bias is not None else y

    def scaled(self, x: str, factor: float) -> str:
        return x if factor == 1.0 else self.binary("mul", x, self.const(factor, self.dtype(x)))

    def gather(self, x: str, index: str, axis: int) -> str:
        """index_select along ``axis`` for an index of any rank (flattened to 1-D, result reshaped back)."""
        shape, ishape = self.shape(x), self.shape(index)
        axis = axis_in(axis, len(shape))
        flat = self.reshape(index, (math.prod(ishape),))
        gathered = (*shape[:axis], math.prod(ishape), *shape[axis + 1:])
        y = self.emit("gather", [x, flat], gathered, self.dtype(x), axis=axis)
        return self.reshape(y, (*shape[:axis], *ishape, *shape[axis + 1:]))

    def slice(self, x: str, axis: int, start: int, end: int, step: int = 1) -> str:
        """One ``slice`` node with Python slice semantics (clamped bounds), or ``x`` when it keeps everything."""
        shape = self.shape(x)
        axis = axis_in(axis, len(shape))
        start, end, step = slice(start, end, step).indices(shape[axis])
        if step <= 0:
            raise ModelImportError("slices with a negative step are not supported")
        if (start, end, step) == (0, shape[axis], 1):
            return x
        out = (*shape[:axis], len(range(start, end, step)), *shape[axis + 1:])
        return self.emit("slice", [x], out, self.dtype(x), axis=axis, start=start, end=end, step=step)

    def select(self, x: str, axis: int, index: int) -> str:
        """``x[..., index, ...]`` along ``axis``: a one-element slice, then a reshape dropping the axis."""
        shape = self.shape(x)
        axis = axis_in(axis, len(shape))
        index = axis_in(index, shape[axis], "index") if shape[axis] else index
        return self.reshape(self.slice(x, axis, index, index + 1), shape[:axis] + shape[axis + 1:])

    def split(self, x: str, axis: int, sizes: Sequence[int]) -> list[str]:
        starts = np.cumsum([0, *sizes]).tolist()
        return [self.slice(x, axis, a, b) for a, b in zip(starts[:-1], starts[1:], strict=True)]

    def log_softmax_nll(self, logits: str, target: str, reduction: str) -> tuple[str, str]:
        """Cross-entropy over [N, C] logits: log_softmax(axis=1) then nll_loss; returns (loss, log_probs)."""
        log_probs = self.emit("log_softmax", [logits], self.shape(logits), self.dtype(logits), axis=1)
        return self.nll(log_probs, target, reduction), log_probs

    def nll(self, log_probs: str, target: str, reduction: str) -> str:
        shape = self.shape(target) if reduction == "none" else ()
        return self.emit("nll_loss", [log_probs, target], shape, self.dtype(log_probs), reduction=reduction)

    def attention(self, q: str, k: str, v: str, mask: str | None, scale: float) -> str:
        """softmax(q @ k^T * scale + mask) @ v (scaled dot-product attention, unfused)."""
        scores = self.scaled(self.matmul(q, k, transpose_b=True), scale)
        if mask is not None:
            scores = self.binary("add", scores, mask)
        probs = self.emit("softmax", [scores], self.shape(scores), self.dtype(scores), axis=len(self.shape(scores)) - 1)
        return self.matmul(probs, v)

    def build(self, outputs: Sequence[str]) -> Graph:
        return normalize(self.builder.build(outputs))
