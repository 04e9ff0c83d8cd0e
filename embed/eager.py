"""Eager interpreter of the IR on PyTorch: the baseline and the reference for generated kernels.

Semantics of each op (``embed.ops``) as implemented here:

* pointwise: numpy-style broadcasting; ``gelu`` approximate ``none`` (erf, the default) or
  ``tanh``; ``cast`` to ``dtype``; ``where(cond, a, b)``; ``batch_norm(x, mean, var, weight, bias)``
  in inference form over axis 1.
* reductions: ``reduce_*`` over ``axes`` (an empty list reduces every axis), ``keepdim`` default
  false; ``softmax``/``log_softmax`` over ``axis``; ``layer_norm``/``rms_norm`` over the trailing
  ``axes`` with optional weight (and bias); ``nll_loss(log_probs [N, C], target [N])`` with
  reduction ``mean``, ``sum`` or ``none``.
* ``matmul``: batched with broadcasting of batch dims; ``transpose_b`` swaps the last two axes of
  the right operand.
* ``conv2d`` NCHW with ``stride``, ``padding`` (2 values: symmetric; 4 values: top, left, bottom,
  right), ``dilation``, ``groups``; ``max_pool2d``/``avg_pool2d`` with ``kernel``, ``stride``,
  ``padding`` (average pools count the padding, as PyTorch does by default).
* ``spmm(indptr, indices, values, dense)``: CSR ``[rows, K]`` times dense ``[K, N]``.
* layout: ``transpose`` by ``perm``; ``reshape``/``expand`` to the declared output shape;
  ``concat``; ``slice`` with positive ``step`` (Python slice bounds); ``gather`` = index_select.

Every result is checked against its declared shape and converted to its declared dtype (or kept in
``compute_dtype`` for floats when one is given, e.g. float64 for a reference run).
"""

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from embed.errors import EmbedError, InvalidGraphError, UnsupportedSubgraphError
from embed.ir import DType, Graph, Node, TensorRole

TORCH_DTYPES = {
    DType.FLOAT64: torch.float64,
    DType.FLOAT32: torch.float32,
    DType.FLOAT16: torch.float16,
    DType.BFLOAT16: torch.bfloat16,
    DType.INT64: torch.int64,
    DType.INT32: torch.int32,
    DType.BOOL: torch.bool,
}

_Args = list[torch.Tensor]
_Kernel = Callable[[_Args, dict, tuple[int, ...]], torch.Tensor]

_UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "neg": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "silu": F.silu, "abs": torch.abs,
    "reciprocal": torch.reciprocal, "erf": torch.erf, "cos": torch.cos, "sin": torch.sin, "identity": torch.clone,
}
_BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum,
}
_REDUCE = {"reduce_sum": torch.sum, "reduce_mean": torch.mean, "reduce_max": torch.amax, "reduce_min": torch.amin}


def _axes(axes: Sequence[int], rank: int) -> list[int]:
    return list(axes) if axes else list(range(rank))


def _norm_shape(x: torch.Tensor, axes: Sequence[int]) -> list[int]:
    rank = x.dim()
    normalized = sorted(a % rank for a in axes)
    if normalized != list(range(rank - len(normalized), rank)):
        raise UnsupportedSubgraphError(f"normalisation over axes {list(axes)} of a rank-{rank} tensor: not trailing")
    return [x.shape[a] for a in normalized]


def _layer_norm(args: _Args, attrs: dict, _: tuple[int, ...]) -> torch.Tensor:
    x, *rest = args
    weight, bias = (rest + [None, None])[:2]
    return F.layer_norm(x, _norm_shape(x, attrs["axes"]), weight, bias, attrs["eps"])


def _rms_norm(args: _Args, attrs: dict, _: tuple[int, ...]) -> torch.Tensor:
    x = args[0]
    return F.rms_norm(x, _norm_shape(x, attrs["axes"]), args[1] if len(args) > 1 else None, attrs["eps"])


def _conv2d(args: _Args, attrs: dict, _: tuple[int, ...]) -> torch.Tensor:
    x, weight = args[:2]
    padding = list(attrs["padding"])
    if len(padding) == 4:
        top, left, bottom, right = padding
        x = F.pad(x, (left, right, top, bottom))
        padding = [0, 0]
    return F.conv2d(
        x, weight, args[2] if len(args) > 2 else None, attrs["stride"], padding, attrs["dilation"], attrs["groups"]
    )


def _spmm(args: _Args, attrs: dict, _: tuple[int, ...]) -> torch.Tensor:
    indptr, indices, values, dense = args
    rows = attrs["rows"]
    if indptr.numel() != rows + 1:
        raise EmbedError(f"spmm: indptr has {indptr.numel()} entries for {rows} rows (needs rows + 1)")
    row_of = torch.repeat_interleave(torch.arange(rows, device=dense.device), (indptr[1:] - indptr[:-1]).long())
    out = torch.zeros((rows, dense.shape[1]), dtype=torch.promote_types(values.dtype, dense.dtype), device=dense.device)
    return out.index_add_(0, row_of, values[:, None] * dense[indices.long()])


def _slice(args: _Args, attrs: dict, _: tuple[int, ...]) -> torch.Tensor:
    x = args[0]
    if attrs["step"] <= 0:
        raise UnsupportedSubgraphError(f"slice with step {attrs['step']}: only positive steps are supported")
    index = [slice(None)] * x.dim()
    index[attrs["axis"] % x.dim()] = slice(attrs["start"], attrs["end"], attrs["step"])
    return x[tuple(index)]


def _nll_loss(args: _Args, attrs: dict, _: tuple[int, ...]) -> torch.Tensor:
    return F.nll_loss(args[0], args[1].long(), reduction=attrs["reduction"])


def _matmul(args: _Args, attrs: dict, _: tuple[int, ...]) -> torch.Tensor:
    a, b = args
    return torch.matmul(a, b.transpose(-1, -2) if attrs.get("transpose_b") and b.dim() > 1 else b)


def _pool(fn: Callable[..., torch.Tensor]) -> _Kernel:
    return lambda args, attrs, _: fn(args[0], attrs["kernel"], attrs["stride"], attrs["padding"])


def _unary(fn: Callable[[torch.Tensor], torch.Tensor]) -> _Kernel:
    return lambda args, _, __: fn(args[0])


def _binary(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> _Kernel:
    return lambda args, _, __: fn(args[0], args[1])


def _reduce(fn: Callable[..., torch.Tensor]) -> _Kernel:
    return lambda args, attrs, _: fn(
        args[0], dim=_axes(attrs["axes"], args[0].dim()), keepdim=attrs.get("keepdim", False)
    )


_KERNELS: dict[str, _Kernel] = {
    **{op: _unary(fn) for op, fn in _UNARY.items()},
    **{op: _binary(fn) for op, fn in _BINARY.items()},
    **{op: _reduce(fn) for op, fn in _REDUCE.items()},
    "gelu": lambda a, at, _: F.gelu(a[0], approximate=at.get("approximate", "none")),
    "cast": lambda a, at, _: a[0].to(TORCH_DTYPES[DType(at["dtype"])]),
    "where": lambda a, _, __: torch.where(a[0].bool(), a[1], a[2]),
    "batch_norm": lambda a, at, _: F.batch_norm(a[0], a[1], a[2], a[3], a[4], training=False, eps=at["eps"]),
    "softmax": lambda a, at, _: torch.softmax(a[0], at["axis"]),
    "log_softmax": lambda a, at, _: torch.log_softmax(a[0], at["axis"]),
    "layer_norm": _layer_norm,
    "rms_norm": _rms_norm,
    "nll_loss": _nll_loss,
    "matmul": _matmul,
    "conv2d": _conv2d,
    "max_pool2d": _pool(F.max_pool2d),
    "avg_pool2d": _pool(F.avg_pool2d),
    "spmm": _spmm,
    "transpose": lambda a, at, _: a[0].permute(at["perm"]),
    "reshape": lambda a, _, shape: a[0].reshape(shape),
    "expand": lambda a, _, shape: a[0].expand(shape),
    "concat": lambda a, at, _: torch.cat(a, at["axis"]),
    "slice": _slice,
    "gather": lambda a, at, _: torch.index_select(a[0], at["axis"], a[1].long()),
}


def _target_dtype(dtype: DType, compute_dtype: torch.dtype | None) -> torch.dtype:
    return compute_dtype if compute_dtype is not None and dtype.is_float else TORCH_DTYPES[dtype]


def _run_node(i: int, node: Node, args: _Args, graph: Graph, compute_dtype: torch.dtype | None) -> torch.Tensor:
    if node.op == "opaque":
        raise UnsupportedSubgraphError(f"node {i} is op {node.attrs['name']!r}, outside the op set; it cannot run")
    out = graph.tensors[node.outputs[0]]
    try:
        result = _KERNELS[node.op](args, dict(node.attrs), out.shape)
    except (RuntimeError, IndexError, TypeError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise EmbedError(f"node {i} ({node.op}) failed: {message}") from None
    if tuple(result.shape) != out.shape:
        raise InvalidGraphError(
            f"node {i} ({node.op}) produced shape {list(result.shape)}, but {node.outputs[0]!r} is declared "
            f"{list(out.shape)}"
        )
    return result.to(_target_dtype(out.dtype, compute_dtype))


def run_eager(
    graph: Graph, inputs: dict[str, torch.Tensor], *, compute_dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """Execute ``graph`` on ``inputs`` (every graph input and param, by name); returns its outputs by name.

    With ``compute_dtype`` (e.g. ``torch.float64``), every float tensor is computed in that dtype. Constants are
    made on the device of the inputs (the cpu without inputs), but for scalars that only binary ops read, which stay
    cpu scalars (:class:`EagerProgram` says why).
    Raises ``UnsupportedSubgraphError`` on an opaque node and ``EmbedError`` on missing inputs.
    """
    missing = [name for name in graph.inputs if name not in inputs]
    if missing:
        raise EmbedError(f"run_eager: missing inputs {missing[:5]}; pass every graph input and param by name")
    values: dict[str, torch.Tensor] = {}
    for name in graph.inputs:
        tensor = graph.tensors[name]
        value = torch.as_tensor(inputs[name])
        if tuple(value.shape) != tensor.shape:
            raise EmbedError(f"run_eager: input {name!r} has shape {list(value.shape)}, expected {list(tensor.shape)}")
        values[name] = value.to(_target_dtype(tensor.dtype, compute_dtype))
    device, scalar = next((v.device for v in values.values()), torch.device("cpu")), _scalar_operands(graph)
    for name, tensor in graph.tensors.items():
        if tensor.role == TensorRole.CONST and tensor.value is not None:
            const = torch.tensor(tensor.value, dtype=torch.float64).reshape(tensor.shape)
            values[name] = const.to("cpu" if name in scalar else device, _target_dtype(tensor.dtype, compute_dtype))
    for i, node in enumerate(graph.nodes):
        values[node.outputs[0]] = _run_node(i, node, [values[t] for t in node.inputs], graph, compute_dtype)
    return {name: values[name] for name in graph.outputs}


class EagerProgram:
    """``graph`` made ready to run many times on ``device``: its constants are built there once, and inputs are
    taken as they are (right shapes and dtypes, on that device), so a call is the ops and nothing else.

    A scalar constant that only binary ops read (relu6's 0 and 6) stays a cpu scalar: PyTorch passes it to a GPU
    kernel as an argument, where a one-element GPU tensor is a broadcast operand read per element, in its slower
    strided kernel (3x the time of the vectorized one on an H200)."""

    def __init__(self, graph: Graph, device: torch.device | str = "cpu") -> None:
        self.graph = graph
        scalar = _scalar_operands(graph)
        self.consts = {
            name: torch.tensor(t.value, dtype=torch.float64).reshape(t.shape)
            .to("cpu" if name in scalar else device, TORCH_DTYPES[t.dtype])
            for name, t in graph.tensors.items() if t.role == TensorRole.CONST and t.value is not None
        }

    def __call__(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        values = {**self.consts, **inputs}
        for i, node in enumerate(self.graph.nodes):
            values[node.outputs[0]] = _run_node(i, node, [values[t] for t in node.inputs], self.graph, None)
        return {name: values[name] for name in self.graph.outputs}


def _scalar_operands(graph: Graph) -> set[str]:
    """Constants of shape () that only binary ops read."""
    readers: dict[str, set[str]] = {}
    for node in graph.nodes:
        for name in node.inputs:
            readers.setdefault(name, set()).add(node.op)
    return {name for name, t in graph.tensors.items()
            if t.role == TensorRole.CONST and t.shape == () and name not in graph.outputs
            and readers.get(name) and readers[name] <= set(_BINARY)}
