"""ATen op -> IR op converters for the PyTorch importer (training and core ATen IR).

A converter takes a ``TorchNode`` and returns the IR tensor name (a list for tuple outputs), or
``None`` when the IR cannot express this use of the op, which then becomes an ``opaque`` node.
"""

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from embed.importers.lowering import rounded
from embed.importers.torch_node import TorchNode, TValue, static_shape
from embed.ir import DType

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}
_INT_MAX = 2**63 - 1


def _pair(value: Any) -> list[int]:
    values = [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
    return values * 2 if len(values) == 1 else values


Converter = Callable[[TorchNode], TValue]
CONVERTERS: dict[str, Converter] = {}


def converter(*keys: str) -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        for key in keys:
            CONVERTERS[key] = fn
        return fn
    return register


_UNARY = ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "neg", "abs", "reciprocal", "erf", "cos", "sin",
          "silu")
_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "pow": "pow", "maximum": "maximum",
           "minimum": "minimum"}


@converter(*_UNARY)
def _unary(n: TorchNode) -> TValue:
    return n.emit(n.key, [n.x("self")])


@converter(*_BINARY, "rsub")
def _binary(n: TorchNode) -> TValue:
    if n.args.get("rounding_mode") is not None:
        return None
    a, b = n.x("self"), n.x("exponent" if "exponent" in n.args else "other")
    alpha = n.args.get("alpha", 1)
    if n.key == "rsub":
        return n.emit("sub", [b, n.lw.scaled(a, alpha)])
    if alpha not in (None, 1):
        b = n.lw.scaled(b, alpha)
    return n.emit(_BINARY[n.key], [a, b])


@converter("where")
def _where(n: TorchNode) -> TValue:
    return n.emit("where", [n.x("condition"), n.x("self"), n.x("other")])


@converter("masked_fill")
def _masked_fill(n: TorchNode) -> TValue:
    return n.emit("where", [n.x("mask"), n.x("value"), n.x("self")])


@converter("clamp")
def _clamp(n: TorchNode) -> TValue:
    y = n.x("self")
    for name, op in (("min", "maximum"), ("max", "minimum")):
        if n.args.get(name) is not None:
            y = n.lw.binary(op, y, n.x(name))
    return y


@converter("gelu")
def _gelu(n: TorchNode) -> TValue:
    return n.emit("gelu", [n.x("self")], approximate=n.args.get("approximate") or "none")


@converter("softmax", "_softmax", "log_softmax", "_log_softmax")
def _softmax(n: TorchNode) -> TValue:
    return n.emit(n.key.lstrip("_"), [n.x("self")], axis=n.args["dim"] % n.rank("self"))


@converter("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm")
def _norm(n: TorchNode) -> TValue:
    if n.extra_outputs_used():
        return None
    x = n.x("input")
    rank = len(n.lw.shape(x))
    axes = list(range(rank - len(n.args["normalized_shape"]), rank))
    inputs = [x] + [n.x(w) for w in ("weight", "bias") if n.args.get(w) is not None]
    eps = n.args.get("eps")
    eps = torch.finfo(torch.float32 if n.lw.dtype(x) != DType.FLOAT64 else torch.float64).eps if eps is None else eps
    op = "layer_norm" if "layer_norm" in n.key else "rms_norm"
    y = n.lw.emit(op, inputs, n.lw.shape(x), n.lw.dtype(x), axes=axes, eps=rounded(eps, DType.FLOAT32))
    return [y, None, None] if n.key in ("native_layer_norm", "_fused_rms_norm") else y


@converter("mean", "sum", "amax", "amin")
def _reduce(n: TorchNode) -> TValue:
    rank = n.rank("self")
    dims = n.args.get("dim")
    axes = sorted({d % rank for d in ([dims] if isinstance(dims, int) else dims or [])}) or list(range(rank))
    op = {"mean": "reduce_mean", "sum": "reduce_sum", "amax": "reduce_max", "amin": "reduce_min"}[n.key]
    return n.emit(op, [n.x("self")], axes=axes, keepdim=bool(n.args.get("keepdim")))


@converter("linear")
def _linear(n: TorchNode) -> TValue:
    bias = n.x("bias") if n.args.get("bias") is not None else None
    return n.lw.linear(n.x("input"), n.x("weight"), bias)


@converter("matmul", "mm", "bmm")
def _matmul(n: TorchNode) -> TValue:
    other = "other" if "other" in n.args else "mat2"
    if n.rank("self") < 2 or n.rank(other) < 2:
        return None
    return n.lw.matmul(n.x("self"), n.x(other))


@converter("addmm")
def _addmm(n: TorchNode) -> TValue:
    lw = n.lw
    y = lw.scaled(lw.matmul(n.x("mat1"), n.x("mat2")), n.args.get("alpha", 1))
    return lw.binary("add", y, lw.scaled(n.x("self"), n.args.get("beta", 1)))


@converter("scaled_dot_product_attention")
def _sdpa(n: TorchNode) -> TValue:
    mask = n.args.get("attn_mask")
    if n.args.get("is_causal") or n.args.get("dropout_p") or n.args.get("enable_gqa"):
        return None
    if mask is not None and n.lw.dtype(n.x("attn_mask")) == DType.BOOL:
        return None
    q = n.x("query")
    scale = n.args.get("scale") or 1 / math.sqrt(n.lw.shape(q)[-1])
    return n.lw.attention(q, n.x("key"), n.x("value"), n.x("attn_mask") if mask is not None else None, scale)


@converter("conv2d", "convolution")
def _conv(n: TorchNode) -> TValue:
    x, w = n.x("input"), n.x("weight")
    if n.args.get("transposed") or len(n.lw.shape(x)) != 4:
        return None
    stride, dilation = _pair(n.args.get("stride", 1)), _pair(n.args.get("dilation", 1))
    padding = n.args.get("padding", 0)
    if isinstance(padding, str):
        kernel = n.lw.shape(w)[2:]
        total = [d * (k - 1) for d, k in zip(dilation, kernel, strict=True)] if padding == "same" else [0, 0]
        if any(t % 2 for t in total):
            return None
        padding = [t // 2 for t in total]
    inputs = [x, w] + ([n.x("bias")] if n.args.get("bias") is not None else [])
    return n.emit("conv2d", inputs, stride=stride, padding=_pair(padding), dilation=dilation,
                  groups=int(n.args.get("groups", 1)))


@converter("batch_norm", "_native_batch_norm_legit_no_training")
def _batch_norm(n: TorchNode) -> TValue:
    if n.args.get("training") or n.extra_outputs_used() or n.args.get("weight") is None or n.args.get("bias") is None:
        return None
    inputs = [n.x(k) for k in ("input", "running_mean", "running_var", "weight", "bias")]
    y = n.emit("batch_norm", inputs, eps=rounded(n.args["eps"], DType.FLOAT32))
    return y if n.key == "batch_norm" else [y, None, None]


@converter("max_pool2d", "max_pool2d_with_indices", "avg_pool2d")
def _pool(n: TorchNode) -> TValue:
    x = n.x("self")
    kernel = _pair(n.args["kernel_size"])
    stride = _pair(n.args.get("stride") or kernel)
    padding = _pair(n.args.get("padding", 0))
    floor = tuple((s + 2 * p - k) // st + 1 for s, p, k, st in zip(n.lw.shape(x)[2:], padding, kernel, stride,
                                                                      strict=True))
    average = n.key == "avg_pool2d"
    if (n.out()[0][2:] != floor or n.extra_outputs_used() or _pair(n.args.get("dilation", 1)) != [1, 1]
            or (average and ((any(padding) and not n.args.get("count_include_pad", True))
                             or n.args.get("divisor_override")))):
        return None
    y = n.emit("avg_pool2d" if average else "max_pool2d", [x], kernel=kernel, stride=stride, padding=padding)
    return [y, None] if n.key == "max_pool2d_with_indices" else y


@converter("adaptive_avg_pool2d", "_adaptive_avg_pool2d")
def _adaptive_pool(n: TorchNode) -> TValue:
    x = n.x("self")
    if n.out()[0] == n.lw.shape(x):
        return x
    if list(n.out()[0][-2:]) != [1, 1]:
        return None
    rank = len(n.lw.shape(x))
    return n.emit("reduce_mean", [x], axes=[rank - 2, rank - 1], keepdim=True)


@converter("permute", "transpose", "t")
def _transpose(n: TorchNode) -> TValue:
    x = n.x("self")
    rank = len(n.lw.shape(x))
    perm = list(range(rank))
    if n.key == "permute":
        perm = [d % rank for d in n.args["dims"]]
    elif rank >= 2:
        a, b = (n.args["dim0"] % rank, n.args["dim1"] % rank) if n.key == "transpose" else (0, 1)
        perm[a], perm[b] = perm[b], perm[a]
    return n.lw.transpose(x, perm)


@converter("view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "flatten", "unflatten", "view_as", "reshape_as")
def _reshape(n: TorchNode) -> TValue:
    return n.lw.reshape(n.x("self"), n.out()[0])


@converter("expand", "expand_as")
def _expand(n: TorchNode) -> TValue:
    x, shape = n.x("self"), n.out()[0]
    return x if n.lw.shape(x) == shape else n.emit("expand", [x], shape=list(shape))


@converter("cat", "concat")
def _cat(n: TorchNode) -> TValue:
    inputs = [t for t in n.val("tensors") if math.prod(n.lw.shape(t)) > 0]
    if len(inputs) == 1:
        return inputs[0]
    return n.emit("concat", inputs, axis=n.args.get("dim", 0) % len(n.out()[0]))


@converter("slice")
def _slice(n: TorchNode) -> TValue:
    start, end = n.args.get("start"), n.args.get("end")
    return n.lw.slice(n.x("self"), n.args.get("dim", 0), start or 0, _INT_MAX if end is None else end,
                      n.args.get("step") or 1)


@converter("select")
def _select(n: TorchNode) -> TValue:
    return n.lw.select(n.x("self"), n.args["dim"], n.args["index"])


@converter("split", "split_with_sizes", "chunk", "unsafe_split")
def _split(n: TorchNode) -> TValue:
    x = n.x("self")
    axis = n.args.get("dim", 0) % len(n.lw.shape(x))
    return n.lw.split(x, axis, [static_shape(v, n.node.name)[axis] for v in n.node.meta["val"]])


@converter("embedding", "index_select")
def _gather(n: TorchNode) -> TValue:
    if n.key == "embedding":
        return n.lw.gather(n.x("weight"), n.x("indices"), 0)
    return n.lw.gather(n.x("self"), n.x("index"), n.args["dim"])


@converter("cross_entropy_loss", "nll_loss", "nll_loss_forward", "nll_loss_nd")
def _loss(n: TorchNode) -> TValue:
    if (n.rank("self") != 2 or n.args.get("weight") is not None or n.args.get("ignore_index", -100) != -100
            or n.args.get("label_smoothing") or n.extra_outputs_used()):
        return None
    reduction = _REDUCTIONS[n.args.get("reduction", 1)]
    if n.key == "cross_entropy_loss":
        return n.lw.log_softmax_nll(n.x("self"), n.x("target"), reduction)[0]
    loss = n.lw.nll(n.x("self"), n.x("target"), reduction)
    return [loss, None] if n.key == "nll_loss_forward" else loss


@converter("_to_copy", "to", "type_as", "clone", "contiguous", "alias", "detach", "lift_fresh_copy", "dropout")
def _copy(n: TorchNode) -> TValue:
    if n.key == "dropout" and n.args.get("train") and n.args.get("p"):
        return None
    x = n.x("self" if "self" in n.args else "input")
    dtype = n.out()[1]
    return x if n.lw.dtype(x) == dtype else n.emit("cast", [x], dtype=dtype.value)


@converter("full", "zeros", "ones", "full_like", "zeros_like", "ones_like", "scalar_tensor")
def _fill(n: TorchNode) -> TValue:
    value = {"zeros": 0.0, "ones": 1.0}.get(n.key.removesuffix("_like"), n.args.get("fill_value", n.args.get("s")))
    if not isinstance(value, (int, float)):
        return None
    shape, dtype = n.out()
    if math.prod(shape) <= 64:
        return n.lw.array(np.full(shape, float(value)), dtype, n.node.name)
    return n.emit("expand", [n.lw.const(value, dtype)], shape=list(shape))


@converter("tunebank.spmm_csr")
def _spmm(n: TorchNode) -> TValue:
    indptr = n.x("indptr")
    return n.emit("spmm", [indptr, n.x("indices"), n.x("values"), n.x("dense")], rows=n.lw.shape(indptr)[0] - 1)
