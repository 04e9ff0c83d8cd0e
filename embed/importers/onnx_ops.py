"""ONNX op -> IR op converters. Each takes an ``OnnxNode`` and returns one value per node output: the
name of an IR tensor, or a static numpy array (folded). Ops or attribute settings the IR cannot
express become ``opaque`` nodes.
"""

import math
from collections.abc import Callable

import numpy as np
from onnx import helper, numpy_helper

from embed.errors import ModelImportError
from embed.importers.lowering import axis_in, broadcast, rounded
from embed.importers.onnx_node import NP_DTYPES, OnnxNode, Value
from embed.ir import MAX_CONST_ELEMENTS, DType

Converter = Callable[[OnnxNode], list[Value]]
MAX_PARTS = 1024  # pieces one SplitToSequence may make (each is a node)
CONVERTERS: dict[tuple[str, str], Converter] = {}
FOLDABLE = frozenset({
    "Add", "Sub", "Mul", "Div", "Neg", "Concat", "Gather", "Unsqueeze", "Squeeze", "Slice",
    "Reshape", "Equal", "Where", "Range", "ConstantOfShape", "Expand", "Identity", "ReduceProd", "Max", "Min",
    "Abs", "Floor", "Ceil", "Sqrt", "Less", "Greater", "Not", "And", "Or", "Transpose", "Tile", "Mod",
})


def converter(*ops: str, domain: str = "") -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        for op in ops:
            CONVERTERS[(domain, op)] = fn
        return fn
    return register


_UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Exp": "exp", "Log": "log",
          "Sqrt": "sqrt", "Neg": "neg", "Abs": "abs", "Reciprocal": "reciprocal", "Cos": "cos", "Sin": "sin"}
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Max": "maximum", "Min": "minimum"}


@converter(*_UNARY)
def _unary(n: OnnxNode) -> list[Value]:
    return [n.emit(_UNARY[n.node.op_type], [n.x(0)])]


@converter(*_BINARY)
def _binary(n: OnnxNode) -> list[Value]:
    op = _BINARY[n.node.op_type]
    operands = [n.x(i) for i in range(len(n.node.input)) if n.has(i)]
    if len(operands) == 1:
        return operands  # type: ignore[return-value]
    result = operands[0]
    for other in operands[1:]:
        result = n.lw.binary(op, result, other)
    return [result]


@converter("Identity", "Dropout")
def _alias(n: OnnxNode) -> list[Value]:
    return n.as_opaque() if n.uses_extra_outputs() else [n.imp.values[n.node.input[0]]]


@converter("Cast", "CastLike")
def _cast(n: OnnxNode) -> list[Value]:
    if n.node.op_type == "Cast":
        dtype = n.imp.dtype_of(n.attr("to", 0), "Cast target")
    else:
        like = n.imp.values[n.node.input[1]]
        dtype = NP_DTYPES.get(like.dtype.name) if isinstance(like, np.ndarray) else n.lw.dtype(like)
    value = n.static(0)
    if value is not None and dtype is not None and dtype != DType.BFLOAT16:
        return [value.astype(dtype.value)]
    x = n.x(0)
    if dtype is None or n.lw.dtype(x) == dtype:
        return [x]
    return [n.lw.emit("cast", [x], n.lw.shape(x), dtype, dtype=dtype.value)]


@converter("Gelu")
def _gelu(n: OnnxNode) -> list[Value]:
    return [n.emit("gelu", [n.x(0)], approximate=n.attr("approximate", "none"))]


@converter("Where")
def _where(n: OnnxNode) -> list[Value]:
    return [n.emit("where", [n.x(0), n.x(1), n.x(2)])]


@converter("Clip")
def _clip(n: OnnxNode) -> list[Value]:
    y = n.x(0)
    for i, op in ((1, "maximum"), (2, "minimum")):
        if n.has(i):
            y = n.lw.binary(op, y, n.x(i))
    return [y]


@converter("Softmax", "LogSoftmax")
def _softmax(n: OnnxNode) -> list[Value]:
    op = "softmax" if n.node.op_type == "Softmax" else "log_softmax"
    return [n.emit(op, [n.x(0)], axis=axis_in(n.attr("axis", -1), len(n.shape(0))))]


@converter("LayerNormalization", "RMSNormalization")
def _norm(n: OnnxNode) -> list[Value]:
    if n.uses_extra_outputs():
        return n.as_opaque()
    rank = len(n.shape(0))
    axes = list(range(axis_in(n.attr("axis", -1), rank), rank))
    op = "layer_norm" if n.node.op_type == "LayerNormalization" else "rms_norm"
    inputs = [n.x(i) for i in range(len(n.node.input)) if n.has(i)]
    return [n.emit(op, inputs, axes=axes, eps=rounded(n.attr("epsilon", 1e-5), DType.FLOAT32))]


_REDUCE = {"ReduceMean": "reduce_mean", "ReduceSum": "reduce_sum", "ReduceMax": "reduce_max", "ReduceMin": "reduce_min"}


@converter(*_REDUCE)
def _reduce(n: OnnxNode) -> list[Value]:
    rank = len(n.shape(0))
    axes = n.ints(1) if n.has(1) else list(n.attr("axes", []))
    if not axes and n.attr("noop_with_empty_axes", 0):
        return [n.x(0)]
    axes = sorted({axis_in(a, rank) for a in axes}) if axes else list(range(rank))
    return [n.emit(_REDUCE[n.node.op_type], [n.x(0)], axes=axes, keepdim=bool(n.attr("keepdims", 1)))]


@converter("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(n: OnnxNode) -> list[Value]:
    op = "reduce_mean" if n.node.op_type == "GlobalAveragePool" else "reduce_max"
    return [n.emit(op, [n.x(0)], axes=list(range(2, len(n.shape(0)))), keepdim=True)]


@converter("MatMul")
def _matmul(n: OnnxNode) -> list[Value]:
    if len(n.shape(0)) < 2 or len(n.shape(1)) < 2:
        return n.as_opaque()
    return [n.emit("matmul", [n.x(0), n.x(1)], transpose_b=False)]


@converter("Gemm")
def _gemm(n: OnnxNode) -> list[Value]:
    lw = n.lw
    a = lw.transpose(n.x(0), [1, 0]) if n.attr("transA", 0) else n.x(0)
    y = lw.scaled(lw.matmul(a, n.x(1), transpose_b=bool(n.attr("transB", 0))), n.attr("alpha", 1.0))
    return [lw.binary("add", y, lw.scaled(n.x(2), n.attr("beta", 1.0))) if n.has(2) else y]


def _window(n: OnnxNode, kernel: list[int]) -> tuple[list[int], list[int], list[int]] | None:
    """(stride, symmetric padding, dilation) of a 2-D window op, or None when the IR cannot express it."""
    stride = list(n.attr("strides", [1, 1]))
    dilation = list(n.attr("dilations", [1, 1]))
    pads = list(n.attr("pads", [0, 0, 0, 0]))
    auto = n.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        size = n.shape(0)[2:]
        total = [max(0, (math.ceil(s / st) - 1) * st + (k - 1) * d + 1 - s)
                 for s, st, k, d in zip(size, stride, kernel, dilation, strict=True)]
        pads = [t // 2 for t in total] + [t - t // 2 for t in total]
    elif auto == "VALID":
        pads = [0, 0, 0, 0]
    if len(kernel) != 2 or len(pads) != 4 or pads[:2] != pads[2:]:
        return None
    return stride, pads[:2], dilation


@converter("Conv")
def _conv(n: OnnxNode) -> list[Value]:
    kernel = list(n.attr("kernel_shape", n.shape(1)[2:]))
    window = _window(n, kernel)
    if window is None or len(n.shape(0)) != 4:
        return n.as_opaque()
    stride, padding, dilation = window
    bias = n.static(2) if n.has(2) else None
    zero_bias = bias is not None and not bias.any()  # the exporter's spelling of bias=None
    inputs = [n.x(i) for i in range(3) if n.has(i) and not (i == 2 and zero_bias)]
    return [n.emit("conv2d", inputs, stride=stride, padding=padding, dilation=dilation, groups=n.attr("group", 1))]


@converter("MaxPool", "AveragePool")
def _pool(n: OnnxNode) -> list[Value]:
    kernel = list(n.attr("kernel_shape", []))
    window = _window(n, kernel)
    if window is None or n.uses_extra_outputs() or window[2] != [1, 1]:
        return n.as_opaque()
    stride, padding, _ = window
    sizes = zip(n.shape(0)[2:], padding, kernel, stride, strict=True)
    floor = tuple((s + 2 * p - k) // st + 1 for s, p, k, st in sizes)
    average = n.node.op_type == "AveragePool"
    if n.out()[0][2:] != floor or (average and any(padding) and not n.attr("count_include_pad", 0)):
        return n.as_opaque()
    return [n.emit("avg_pool2d" if average else "max_pool2d", [n.x(0)], kernel=kernel, stride=stride,
                   padding=padding)]


@converter("BatchNormalization")
def _batch_norm(n: OnnxNode) -> list[Value]:
    if n.uses_extra_outputs() or n.attr("training_mode", 0):
        return n.as_opaque()
    x, weight, bias, mean, var = (n.x(i) for i in range(5))
    return [n.emit("batch_norm", [x, mean, var, weight, bias], eps=rounded(n.attr("epsilon", 1e-5), DType.FLOAT32))]


@converter("Transpose")
def _transpose(n: OnnxNode) -> list[Value]:
    rank = len(n.shape(0))
    perm = n.attr("perm", list(range(rank))[::-1])
    return [n.lw.transpose(n.x(0), [axis_in(p, rank, "perm entry") for p in perm])]


def _reshape_target(shape: tuple[int, ...], spec: list[int], allowzero: bool) -> tuple[int, ...]:
    dims = [shape[i] if d == 0 and not allowzero else d for i, d in enumerate(spec)]
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        dims[dims.index(-1)] = math.prod(shape) // known if known else 0
    if math.prod(dims) != math.prod(shape) or any(d < 0 for d in dims):
        raise ModelImportError(f"cannot reshape {list(shape)} to {spec}")
    return tuple(dims)


@converter("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(n: OnnxNode) -> list[Value]:
    x = n.x(0)
    if n.node.op_type == "Reshape" and n.imp.types.get(n.node.output[0], (None, 0))[0] is None:
        return [n.lw.reshape(x, _reshape_target(n.lw.shape(x), n.ints(1), bool(n.attr("allowzero", 0))))]
    return [n.lw.reshape(x, n.out()[0])]


@converter("Expand")
def _expand(n: OnnxNode) -> list[Value]:
    shape = broadcast(n.shape(0), tuple(n.ints(1)))
    value = n.static(0)
    if value is not None and math.prod(shape) <= MAX_CONST_ELEMENTS:
        return [np.broadcast_to(value, shape).copy()]
    x = n.x(0)
    return [x if n.lw.shape(x) == shape else n.lw.emit("expand", [x], shape, n.lw.dtype(x), shape=list(shape))]


@converter("ConstantOfShape")
def _constant_of_shape(n: OnnxNode) -> list[Value]:
    value = n.attr("value")
    shape, dtype = n.out()
    if n.static(0) is not None and tuple(n.ints(0)) != shape:  # the computed shape, whatever was declared
        raise ModelImportError(f"ConstantOfShape makes {n.ints(0)[:8]}, not the declared {list(shape)}")
    scalar = n.lw.const(float(numpy_helper.to_array(value).reshape(-1)[0]) if value is not None else 0.0, dtype)
    return [n.lw.emit("expand", [scalar], shape, dtype, shape=list(shape))]


@converter("Concat")
def _concat(n: OnnxNode) -> list[Value]:
    inputs = [n.x(i) for i in range(len(n.node.input)) if n.has(i) and math.prod(n.shape(i)) > 0]
    if len(inputs) == 1:
        return inputs  # type: ignore[return-value]
    return [n.emit("concat", inputs, axis=axis_in(n.attr("axis"), len(n.shape(0))))]


@converter("Slice")
def _slice(n: OnnxNode) -> list[Value]:
    starts, ends = n.ints(1), n.ints(2)
    axes = n.ints(3) if n.has(3) else list(range(len(starts)))
    steps = n.ints(4) if n.has(4) else [1] * len(starts)
    if any(s < 0 for s in steps):
        return n.as_opaque()
    y = n.x(0)
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        y = n.lw.slice(y, axis, start, end, step)
    return [y]


@converter("Split")
def _split(n: OnnxNode) -> list[Value]:
    x = n.x(0)
    axis = axis_in(n.attr("axis", 0), len(n.lw.shape(x)))
    return n.lw.split(x, axis, [n.out(k)[0][axis] for k in range(len(n.node.output))])  # type: ignore[return-value]


@converter("SplitToSequence")
def _split_to_sequence(n: OnnxNode) -> list[Value]:
    x = n.x(0)
    shape = n.lw.shape(x)
    axis = axis_in(n.attr("axis", 0), len(shape))
    sizes = n.ints(1) if n.has(1) else [1] * min(shape[axis], MAX_PARTS + 1)
    if len(sizes) == 1 and shape[axis] != sizes[0]:
        if sizes[0] <= 0:
            raise ModelImportError(f"split size {sizes[0]} is not positive")
        sizes = [sizes[0]] * (shape[axis] // sizes[0]) + ([shape[axis] % sizes[0]] if shape[axis] % sizes[0] else [])
    if len(sizes) > MAX_PARTS or (not n.has(1) and shape[axis] > MAX_PARTS):
        raise ModelImportError(f"SplitToSequence into {max(len(sizes), shape[axis])} parts, over the limit of "
                               f"{MAX_PARTS}")
    parts = n.lw.split(x, axis, sizes)
    if not n.has(1) and not n.attr("keepdims", 1):
        parts = [n.lw.reshape(p, shape[:axis] + shape[axis + 1:]) for p in parts]
    return [parts]


@converter("SequenceAt")
def _sequence_at(n: OnnxNode) -> list[Value]:
    sequence = n.imp.values[n.node.input[0]]
    if not isinstance(sequence, list):
        return n.as_opaque()
    return [sequence[n.ints(1)[0]]]


@converter("Gather")
def _gather(n: OnnxNode) -> list[Value]:
    index = n.static(1)
    if index is not None and index.ndim == 0:
        return [n.lw.select(n.x(0), n.attr("axis", 0), int(index))]
    return [n.lw.gather(n.x(0), n.x(1), n.attr("axis", 0))]


@converter("Shape")
def _shape(n: OnnxNode) -> list[Value]:
    shape = n.shape(0)
    return [np.array(shape[n.attr("start", 0):n.attr("end", len(shape))], dtype=np.int64)]


@converter("Size")
def _size(n: OnnxNode) -> list[Value]:
    return [np.array(math.prod(n.shape(0)), dtype=np.int64)]


@converter("Constant")
def _constant(n: OnnxNode) -> list[Value]:
    attr = n.node.attribute[0] if len(n.node.attribute) == 1 else None
    if attr is None or attr.name == "sparse_value":
        return n.as_opaque()
    if attr.name == "value":
        shape = tuple(attr.t.dims)
        if math.prod(shape) > 4096:
            shape, dtype = n.out()
            return [n.lw.builder.param(n.lw.fresh_name(n.node.output[0]), shape, dtype)]
        return [numpy_helper.to_array(attr.t)]
    value = helper.get_attribute_value(attr)
    return [np.asarray(value, dtype=np.float32 if attr.name.startswith("value_float") else np.int64)]


def _loss_ready(n: OnnxNode) -> bool:
    return len(n.shape(0)) == 2 and not n.has(2) and n.attr("ignore_index", -100) == -100


@converter("NegativeLogLikelihoodLoss")
def _nll(n: OnnxNode) -> list[Value]:
    if not _loss_ready(n):
        return n.as_opaque()
    return [n.lw.nll(n.x(0), n.x(1), n.attr("reduction", "mean"))]


@converter("SoftmaxCrossEntropyLoss")
def _cross_entropy(n: OnnxNode) -> list[Value]:
    if not _loss_ready(n):
        return n.as_opaque()
    return list(n.lw.log_softmax_nll(n.x(0), n.x(1), n.attr("reduction", "mean")))


@converter("spmm_csr", domain="tunebank")
def _spmm(n: OnnxNode) -> list[Value]:
    return [n.emit("spmm", [n.x(i) for i in range(4)], rows=n.shape(0)[0] - 1)]
