"""Lower a subgraph's ``Graph`` to a ``LoopProgram`` (see ``embed.loopnest``).

Each node becomes one or more nests, in graph order, unfused (fusion is a transformation):

    pointwise, cast, identity, batch_norm    one nest over the output, inputs broadcast numpy-style
    reduce_sum/mean/max/min                  one reduction nest (mean: epilogue * 1/count); [] = all axes
    softmax / log_softmax                    max nest, exp-sum nest, normalize nest
    layer_norm                               mean nest, variance nest (biased), normalize nest
    rms_norm                                 mean-square nest, normalize nest
    nll_loss                                 -log_probs[i, target[i]]; sum/mean as a reduction nest
    matmul                                   torch.matmul semantics (1-D operands, broadcast batch dims)
    conv2d                                   groups as a parallel dim; padding as a 0-filled access
    max_pool2d / avg_pool2d                  -inf / 0 filled windows; avg counts the padding (torch default)
    spmm                                     CSR: ragged reduction over [indptr[row], indptr[row + 1])
    transpose, expand, slice, gather         one copy nest with an affine (gather: indirect) read
    reshape                                  one copy nest; reads use // and % of the flattened offset,
                                             simplified to affine where the shapes split or merge evenly
    concat                                   one copy nest per input, writing at the input's offset

Known departures from PyTorch: nll_loss has no ignore_index (every target counts), pools have no
dilation or ceil_mode. Scalar constants are inlined as ``Const``. Opaque nodes raise
``UnsupportedSubgraphError``; shapes or attributes that do not fit the op raise ``InvalidGraphError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from embed.errors import InvalidGraphError, UnsupportedSubgraphError
from embed.ir import DType, Graph, Node, TensorRole
from embed.loopnest import (
    Acc,
    Access,
    Affine,
    Buffer,
    BufferKind,
    Call,
    Cast,
    Combiner,
    Const,
    Dim,
    DimKind,
    Expr,
    Indirect,
    Load,
    LoopNest,
    LoopProgram,
    Ragged,
    Statement,
    floordiv,
    make_nest,
    map_leaves,
    mod,
)
from embed.ops import BINARY, UNARY

_ROLE_KIND = {
    TensorRole.INPUT: BufferKind.INPUT,
    TensorRole.PARAM: BufferKind.PARAM,
    TensorRole.CONST: BufferKind.CONST,
}
_P, _R = DimKind.PARALLEL, DimKind.REDUCTION


def lower(graph: Graph) -> LoopProgram:
    """The loop program of ``graph``; raises UnsupportedSubgraphError / InvalidGraphError."""
    ctx = _Lowering(graph)
    for i, node in enumerate(graph.nodes):
        rule = _RULES.get(node.op)
        if rule is None:
            raise UnsupportedSubgraphError(f"node {i} ({node.op}) cannot be lowered to loop nests")
        ctx.where = f"node {i} ({node.op})"
        rule(ctx, node)
    return ctx.program()


class _Lowering:
    """Buffers and nests built so far, plus helpers shared by the op rules."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.where = ""
        self.nests: list[LoopNest] = []
        self.buffers: dict[str, Buffer] = {}
        outputs = set(graph.outputs)
        for name, t in graph.tensors.items():
            kind = _ROLE_KIND.get(t.role, BufferKind.OUTPUT if name in outputs else BufferKind.TEMP)
            self.buffers[name] = Buffer(name, t.shape, t.dtype, kind, t.value)
        self._dims = 0

    def program(self) -> LoopProgram:
        used = {a.tensor for n in self.nests for a in [n.statement.write, *n.loads()]} | set(self.graph.inputs)
        used |= set(self.graph.outputs)
        buffers = {k: b for k, b in self.buffers.items() if k in used}
        return LoopProgram(buffers, tuple(self.nests), self.graph.inputs, self.graph.outputs, self.graph.name)

    def fail(self, msg: str) -> InvalidGraphError:
        return InvalidGraphError(f"{self.where}: {msg}")

    def shape(self, name: str) -> tuple[int, ...]:
        return self.buffers[name].shape

    def dtype(self, name: str) -> DType:
        return self.buffers[name].dtype

    def temp(self, hint: str, shape: Sequence[int], dtype: DType = DType.FLOAT64) -> str:
        name, n = hint, 0
        while name in self.buffers:
            n += 1
            name = f"{hint}{n}"
        self.buffers[name] = Buffer(name, tuple(shape), dtype, BufferKind.TEMP)
        return name

    def dims(self, shape: Sequence[int], kind: DimKind = _P) -> tuple[list[Dim], list[Affine]]:
        """Fresh dims over ``shape`` (none for size-1 axes) and the index of each axis."""
        dims, index = [], []
        for n in shape:
            if n == 1:
                index.append(Affine())
                continue
            self._dims += 1
            dims.append(Dim(f"_d{self._dims}", n, kind))
            index.append(Affine.of(dims[-1].name))
        return dims, index

    def load(self, name: str, index: Sequence[Affine], fill: float | None = None) -> Expr:
        buf = self.buffers[name]
        if buf.kind == BufferKind.CONST and buf.numel == 1 and buf.value is not None:
            return Const(buf.value[0])
        return Load(Access(name, tuple(index), fill))

    def bload(self, name: str, out_index: Sequence[Affine], out_shape: Sequence[int]) -> Expr:
        """Load ``name`` broadcast (numpy rules) to an output of ``out_shape`` indexed by ``out_index``."""
        return self.load(name, self.broadcast_index(name, out_index, out_shape))

    def broadcast_index(self, name: str, out_index: Sequence[Affine], out_shape: Sequence[int]) -> list[Affine]:
        shape = self.shape(name)
        lead = len(out_shape) - len(shape)
        if lead < 0 or any(s not in (1, out_shape[lead + a]) for a, s in enumerate(shape)):
            raise self.fail(f"{name} of shape {list(shape)} does not broadcast to {list(out_shape)}")
        return [Affine() if s == 1 else out_index[lead + a] for a, s in enumerate(shape)]


    def emit(
        self,
        op: str,
        dims: Sequence[Dim],
        write: str,
        write_index: Sequence[Affine],
        body: Expr,
        combiner: Combiner | None = None,
        epilogue: Expr | None = None,
    ) -> None:
        """Append a nest; without reduction dims (all reduced extents were 1) the body is the value."""
        if not any(d.kind == _R for d in dims) and combiner is not None:
            body, combiner, epilogue = body if epilogue is None else _substitute_acc(epilogue, body), None, None
        st = Statement(Access(write, tuple(write_index)), body, combiner, epilogue)
        shapes = {k: b.shape for k, b in self.buffers.items()}
        self.nests.append(make_nest(op, dims, st, shapes))

    def reduction(
        self,
        op: str,
        shape: Sequence[int],
        axes: Sequence[int],
        write: str,
        body: Callable[[list[Affine]], Expr],
        combiner: Combiner,
        epilogue: Expr | None = None,
        keepdim: bool = True,
    ) -> None:
        """``write[kept axes] = epilogue(combiner over axes of body(index over shape))``."""
        dims: list[Dim] = []
        index: list[Affine] = []
        for a, n in enumerate(shape):
            ds, ix = self.dims([n], _R if a in axes else _P)
            dims += ds
            index += ix
        write_index = [Affine() if a in axes else e for a, e in enumerate(index) if keepdim or a not in axes]
        self.emit(op, dims, write, write_index, body(index), combiner, epilogue)

    def expect(self, node: Node, shape: Sequence[int]) -> str:
        out = node.outputs[0]
        if tuple(shape) != self.shape(out):
            raise self.fail(f"output {out} has shape {list(self.shape(out))}, expected {list(shape)}")
        return out

    def axis(self, axis: int, rank: int) -> int:
        if not -rank <= axis < rank:
            raise self.fail(f"axis {axis} out of range for rank {rank}")
        return axis % rank

    def float_dtype(self, name: str) -> DType:
        dtype = self.dtype(name)
        return dtype if dtype.is_float else DType.FLOAT32


def _substitute_acc(expr: Expr, value: Expr) -> Expr:
    return map_leaves(expr, lambda e: value if isinstance(e, Acc) else e)


def _call(op: str, *args: Expr) -> Call:
    return Call(op, args)


def _keep(shape: Sequence[int], axes: Sequence[int]) -> list[int]:
    return [1 if a in axes else n for a, n in enumerate(shape)]


def _ints(ctx: _Lowering, node: Node, key: str, n: int, default: Sequence[int] | None = None) -> list[int]:
    """An ints attribute of length ``n`` (a single value is repeated; [] takes ``default``)."""
    value = list(node.attrs.get(key, []))  # type: ignore[arg-type]
    if not value and default is not None:
        value = list(default)
    if len(value) == 1:
        value = value * n
    if len(value) != n:
        raise ctx.fail(f"attribute {key} needs {n} values, got {value}")
    return value


# ---------------------------------------------------------------------------------------------
# Rules, one per op (pointwise ops share one)


def _pointwise(ctx: _Lowering, node: Node) -> None:
    shapes = [ctx.shape(i) for i in node.inputs]
    try:
        out_shape = tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ctx.fail(f"input shapes {[list(s) for s in shapes]} do not broadcast") from None
    out = ctx.expect(node, out_shape)
    dims, index = ctx.dims(out_shape)
    args = [ctx.bload(i, index, out_shape) for i in node.inputs]
    if node.op == "identity":
        body: Expr = args[0]
    elif node.op == "cast":
        try:
            dtype = DType(node.attrs["dtype"])
        except ValueError:
            raise ctx.fail(f"unknown dtype {node.attrs['dtype']!r}") from None
        if dtype != ctx.dtype(out):
            raise ctx.fail(f"casts to {dtype.value} but the output is {ctx.dtype(out).value}")
        body = Cast(dtype, args[0])
    elif node.op == "gelu":
        approximate = node.attrs.get("approximate", "none")
        if approximate not in ("none", "tanh"):
            raise ctx.fail(f"approximate must be 'none' or 'tanh', got {approximate!r}")
        body = Call("gelu" if approximate == "none" else "gelu_tanh", tuple(args))
    else:
        body = Call(node.op, tuple(args))
    ctx.emit(node.op, dims, out, index, body)


def _batch_norm(ctx: _Lowering, node: Node) -> None:
    x, mean, var, weight, bias = node.inputs
    shape = ctx.shape(x)
    if len(shape) < 2:
        raise ctx.fail(f"input must have rank >= 2, got shape {list(shape)}")
    for t in (mean, var, weight, bias):
        if ctx.shape(t) != (shape[1],):
            raise ctx.fail(f"{t} must have shape [{shape[1]}], got {list(ctx.shape(t))}")
    out = ctx.expect(node, shape)
    dims, index = ctx.dims(shape)
    c = [index[1]]
    eps = Const(float(node.attrs["eps"]))
    std = _call("sqrt", _call("add", ctx.load(var, c), eps))
    norm = _call("div", _call("sub", ctx.load(x, index), ctx.load(mean, c)), std)
    body = _call("add", _call("mul", norm, ctx.load(weight, c)), ctx.load(bias, c))
    ctx.emit(node.op, dims, out, index, body)


def _reduce(ctx: _Lowering, node: Node) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    axes = sorted({ctx.axis(a, len(shape)) for a in node.attrs["axes"]}) or list(range(len(shape)))  # type: ignore[union-attr]
    keepdim = bool(node.attrs.get("keepdim", False))
    out = ctx.expect(node, _keep(shape, axes) if keepdim else [n for a, n in enumerate(shape) if a not in axes])
    combiner = {"reduce_max": Combiner.MAX, "reduce_min": Combiner.MIN}.get(node.op, Combiner.SUM)
    count = math.prod(shape[a] for a in axes)
    epilogue = _call("div", Acc(), Const(float(count))) if node.op == "reduce_mean" else None
    ctx.reduction(node.op, shape, axes, out, lambda ix: ctx.load(x, ix), combiner, epilogue, keepdim)


def _softmax(ctx: _Lowering, node: Node) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    axis = ctx.axis(int(node.attrs["axis"]), len(shape))  # type: ignore[arg-type]
    out = ctx.expect(node, shape)
    dtype = ctx.float_dtype(out)
    m = ctx.temp(f"{out}_max", _keep(shape, [axis]), dtype)
    s = ctx.temp(f"{out}_sum", _keep(shape, [axis]), dtype)
    ctx.reduction(node.op, shape, [axis], m, lambda ix: ctx.load(x, ix), Combiner.MAX)

    def shifted(ix: list[Affine]) -> Expr:
        return _call("sub", ctx.load(x, ix), ctx.bload(m, ix, shape))

    ctx.reduction(node.op, shape, [axis], s, lambda ix: _call("exp", shifted(ix)), Combiner.SUM)
    dims, index = ctx.dims(shape)
    if node.op == "softmax":
        body = _call("div", _call("exp", shifted(index)), ctx.bload(s, index, shape))
    else:
        body = _call("sub", shifted(index), _call("log", ctx.bload(s, index, shape)))
    ctx.emit(node.op, dims, out, index, body)


def _trailing_axes(ctx: _Lowering, node: Node, rank: int) -> list[int]:
    axes = sorted({ctx.axis(a, rank) for a in node.attrs["axes"]})  # type: ignore[union-attr]
    if not axes or axes != list(range(rank - len(axes), rank)):
        raise ctx.fail(f"axes {node.attrs['axes']} must be the trailing axes of a rank-{rank} input")
    return axes


def _norm(ctx: _Lowering, node: Node) -> None:
    """layer_norm and rms_norm over trailing axes, with optional affine parameters."""
    x, *params = node.inputs
    shape = ctx.shape(x)
    axes = _trailing_axes(ctx, node, len(shape))
    for p in params:
        if ctx.shape(p) != shape[axes[0]:]:
            raise ctx.fail(f"{p} must have shape {list(shape[axes[0]:])}, got {list(ctx.shape(p))}")
    out = ctx.expect(node, shape)
    dtype = ctx.float_dtype(out)
    count = Const(float(math.prod(shape[a] for a in axes)))
    eps = Const(float(node.attrs["eps"]))
    mean_of = _call("div", Acc(), count)
    if node.op == "layer_norm":
        mean = ctx.temp(f"{out}_mean", _keep(shape, axes), dtype)
        var = ctx.temp(f"{out}_var", _keep(shape, axes), dtype)
        ctx.reduction(node.op, shape, axes, mean, lambda ix: ctx.load(x, ix), Combiner.SUM, mean_of)

        def centred(ix: list[Affine]) -> Expr:
            return _call("sub", ctx.load(x, ix), ctx.bload(mean, ix, shape))

        ctx.reduction(
            node.op, shape, axes, var, lambda ix: _call("mul", centred(ix), centred(ix)), Combiner.SUM, mean_of
        )
    else:
        var = ctx.temp(f"{out}_ms", _keep(shape, axes), dtype)
        ctx.reduction(node.op, shape, axes, var, lambda ix: _call("mul", ctx.load(x, ix), ctx.load(x, ix)),
                      Combiner.SUM, mean_of)

        def centred(ix: list[Affine]) -> Expr:
            return ctx.load(x, ix)

    dims, index = ctx.dims(shape)
    body: Expr = _call("mul", centred(index), _call("rsqrt", _call("add", ctx.bload(var, index, shape), eps)))
    for p, op in zip(params, ("mul", "add"), strict=False):
        body = _call(op, body, ctx.bload(p, index, shape))
    ctx.emit(node.op, dims, out, index, body)


def _nll_loss(ctx: _Lowering, node: Node) -> None:
    logp, target = node.inputs
    shape, tshape = ctx.shape(logp), ctx.shape(target)
    if len(shape) != 2 or tshape != shape[:1]:
        raise ctx.fail(f"needs log_probs [N, C] and target [N], got {list(shape)} and {list(tshape)}")
    if ctx.dtype(target).is_float:
        raise ctx.fail(f"target {target} must be an integer tensor")
    reduction = node.attrs["reduction"]
    if reduction not in ("mean", "sum", "none"):
        raise ctx.fail(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    out = ctx.expect(node, shape[:1] if reduction == "none" else ())

    def body(ix: list[Affine]) -> Expr:
        return _call("neg", ctx.load(logp, [ix[0], Affine.of(Indirect(target, (ix[0],)))]))

    if reduction == "none":
        dims, index = ctx.dims(shape[:1])
        ctx.emit(node.op, dims, out, index, body(index))
        return
    epilogue = _call("div", Acc(), Const(float(shape[0]))) if reduction == "mean" else None
    ctx.reduction(node.op, shape[:1], [0], out, body, Combiner.SUM, epilogue, keepdim=False)


def _matmul(ctx: _Lowering, node: Node) -> None:
    a, b = node.inputs
    sa, sb = ctx.shape(a), ctx.shape(b)
    transpose_b = bool(node.attrs.get("transpose_b", False))
    if not sa or not sb or (transpose_b and len(sb) < 2):
        raise ctx.fail(f"cannot multiply shapes {list(sa)} and {list(sb)} (transpose_b={transpose_b})")
    m, k = (sa[-2], sa[-1]) if len(sa) > 1 else (1, sa[0])
    kb, n = (sb[-2], sb[-1]) if len(sb) > 1 else (sb[0], 1)
    if transpose_b:
        kb, n = n, kb
    try:
        batch = tuple(np.broadcast_shapes(sa[:-2], sb[:-2]))
    except ValueError:
        raise ctx.fail(f"batch dims of {list(sa)} and {list(sb)} do not broadcast") from None
    if k != kb:
        raise ctx.fail(f"inner dims differ: {list(sa)} x {list(sb)} (transpose_b={transpose_b})")
    out_shape = (*batch, *([m] if len(sa) > 1 else []), *([n] if len(sb) > 1 else []))
    out = ctx.expect(node, out_shape)
    bdims, bix = ctx.dims(batch)
    mdims, (mi,) = ctx.dims([m])
    ndims, (ni,) = ctx.dims([n])
    kdims, (ki,) = ctx.dims([k], _R)

    def batch_index(shape: Sequence[int]) -> list[Affine]:
        lead = len(batch) - len(shape)
        return [Affine() if s == 1 else bix[lead + j] for j, s in enumerate(shape)]

    a_index = [*batch_index(sa[:-2]), mi, ki] if len(sa) > 1 else [ki]
    b_tail = ([ni, ki] if transpose_b else [ki, ni]) if len(sb) > 1 else [ki]
    body = _call("mul", ctx.load(a, a_index), ctx.load(b, [*batch_index(sb[:-2]), *b_tail]))
    out_index = [*bix, *([mi] if len(sa) > 1 else []), *([ni] if len(sb) > 1 else [])]
    ctx.emit(node.op, [*bdims, *mdims, *ndims, *kdims], out, out_index, body, Combiner.SUM)


def _window(ctx: _Lowering, node: Node, kernel: Sequence[int], dilation: Sequence[int]) -> tuple[
    list[int], list[int], list[int], list[int], tuple[int, ...]
]:
    """Spatial stride, padding (top, left, bottom, right), output size; checks the input's rank."""
    shape = ctx.shape(node.inputs[0])
    if len(shape) not in (3, 4):
        raise ctx.fail(f"input must be [N, C, H, W] or [C, H, W], got {list(shape)}")
    stride = _ints(ctx, node, "stride", 2, default=kernel)
    pads = list(node.attrs["padding"]) or [0]  # type: ignore[arg-type]
    pads = pads * 4 if len(pads) == 1 else pads * 2 if len(pads) == 2 else pads
    if len(pads) != 4 or min(pads) < 0 or min(stride) < 1 or min(dilation) < 1 or min(kernel) < 1:
        raise ctx.fail("stride, dilation and kernel must be >= 1 and padding 1, 2 or 4 values >= 0")
    size = [
        (shape[-2 + i] + pads[i] + pads[i + 2] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in (0, 1)
    ]
    if min(size) < 1:
        raise ctx.fail(f"window larger than the padded input {list(shape)}")
    return stride, pads, size, list(shape[:-3]), shape


def _conv2d(ctx: _Lowering, node: Node) -> None:
    x, w, *bias = node.inputs
    wshape = ctx.shape(w)
    groups = int(node.attrs["groups"])  # type: ignore[arg-type]
    if len(wshape) != 4 or groups < 1:
        raise ctx.fail(f"weight must be [Cout, Cin/groups, KH, KW] and groups >= 1, got {list(wshape)}, {groups}")
    cout, cin_g, kh, kw = wshape
    dilation = _ints(ctx, node, "dilation", 2, default=[1])
    stride, pads, size, lead, shape = _window(ctx, node, [kh, kw], dilation)
    if shape[-3] != cin_g * groups or cout % groups:
        raise ctx.fail(f"channels of input {list(shape)} and weight {list(wshape)} do not match groups={groups}")
    if bias and ctx.shape(bias[0]) != (cout,):
        raise ctx.fail(f"bias must have shape [{cout}], got {list(ctx.shape(bias[0]))}")
    out = ctx.expect(node, (*lead, cout, *size))
    ndims, nix = ctx.dims(lead)
    gdims, (gi,) = ctx.dims([groups])
    cdims, (ci,) = ctx.dims([cout // groups])
    sdims, (hi, wi) = ctx.dims(size)
    rdims, (ri, khi, kwi) = ctx.dims([cin_g, kh, kw], _R)
    padded = any(pads)
    x_index = [*nix, gi * cin_g + ri, hi * stride[0] + khi * dilation[0] + -pads[0],
               wi * stride[1] + kwi * dilation[1] + -pads[1]]
    co = gi * (cout // groups) + ci
    body = _call("mul", ctx.load(x, x_index, 0.0 if padded else None), ctx.load(w, [co, ri, khi, kwi]))
    epilogue = _call("add", Acc(), ctx.load(bias[0], [co])) if bias else None
    ctx.emit(node.op, [*ndims, *gdims, *cdims, *sdims, *rdims], out, [*nix, co, hi, wi], body, Combiner.SUM, epilogue)


def _pool(ctx: _Lowering, node: Node) -> None:
    x = node.inputs[0]
    kernel = _ints(ctx, node, "kernel", 2)
    stride, pads, size, lead, shape = _window(ctx, node, kernel, [1, 1])
    out = ctx.expect(node, (*shape[:-2], *size))
    pdims, pix = ctx.dims([*shape[:-2], *size])
    rdims, (khi, kwi) = ctx.dims(kernel, _R)
    *cix, hi, wi = pix
    is_max = node.op == "max_pool2d"
    fill = (-math.inf if is_max else 0.0) if any(pads) else None
    x_index = [*cix, hi * stride[0] + khi + -pads[0], wi * stride[1] + kwi + -pads[1]]
    combiner = Combiner.MAX if is_max else Combiner.SUM
    epilogue = None if is_max else _call("div", Acc(), Const(float(kernel[0] * kernel[1])))
    ctx.emit(node.op, [*pdims, *rdims], out, pix, ctx.load(x, x_index, fill), combiner, epilogue)


def _spmm(ctx: _Lowering, node: Node) -> None:
    indptr, indices, values, dense = node.inputs
    rows = int(node.attrs["rows"])  # type: ignore[arg-type]
    nnz = ctx.shape(values)[0] if len(ctx.shape(values)) == 1 else -1
    dshape = ctx.shape(dense)
    if (ctx.shape(indptr) != (rows + 1,) or ctx.shape(indices) != (nnz,) or len(dshape) != 2
            or ctx.dtype(indptr).is_float or ctx.dtype(indices).is_float):
        raise ctx.fail("needs int indptr [rows + 1], int indices [nnz], values [nnz] and dense [K, N]")
    out = ctx.expect(node, (rows, dshape[1]))
    rdims, (ri,) = ctx.dims([rows])
    cdims, (ci,) = ctx.dims([dshape[1]])
    ragged = Ragged(Affine.of(Indirect(indptr, (ri,))), Affine.of(Indirect(indptr, (ri + 1,))))
    e = Dim("_nnz", -(-nnz // rows) if rows else 0, _R, ragged)
    ei = Affine.of(e.name)
    body = _call("mul", ctx.load(values, [ei]), ctx.load(dense, [Affine.of(Indirect(indices, (ei,))), ci]))
    ctx.emit(node.op, [*rdims, *cdims, e], out, [ri, ci], body, Combiner.SUM)


_Read = Callable[[list[Affine], list[Dim]], list[Affine]]


def _copy(ctx: _Lowering, node: Node, out_shape: Sequence[int], read: _Read) -> None:
    """``out[i] = x[read(i)]`` over the output's shape."""
    out = ctx.expect(node, out_shape)
    dims, index = ctx.dims(out_shape)
    ctx.emit(node.op, dims, out, index, ctx.load(node.inputs[0], read(index, dims)))


def _transpose(ctx: _Lowering, node: Node) -> None:
    shape = ctx.shape(node.inputs[0])
    perm = list(node.attrs["perm"])  # type: ignore[arg-type]
    if sorted(perm) != list(range(len(shape))):
        raise ctx.fail(f"perm {perm} is not a permutation of the {len(shape)} axes")

    def read(index: list[Affine], _: list[Dim]) -> list[Affine]:
        return [index[perm.index(a)] for a in range(len(shape))]

    _copy(ctx, node, [shape[p] for p in perm], read)


def _reshape(ctx: _Lowering, node: Node) -> None:
    shape, out_shape = ctx.shape(node.inputs[0]), ctx.shape(node.outputs[0])
    if math.prod(shape) != math.prod(out_shape):
        raise ctx.fail(f"cannot reshape {list(shape)} to {list(out_shape)}")

    def read(index: list[Affine], dims: list[Dim]) -> list[Affine]:
        extents = {d.name: d.extent for d in dims}
        flat = Affine()
        for e, s in zip(index, _strides(out_shape), strict=True):
            flat = flat + e * s
        return [mod(floordiv(flat, s, extents), n, extents) for s, n in zip(_strides(shape), shape, strict=True)]

    _copy(ctx, node, out_shape, read)


def _strides(shape: Sequence[int]) -> list[int]:
    return [math.prod(shape[a + 1:]) for a in range(len(shape))]


def _expand(ctx: _Lowering, node: Node) -> None:
    x = node.inputs[0]
    out_shape = ctx.shape(node.outputs[0])
    _copy(ctx, node, out_shape, lambda index, _: ctx.broadcast_index(x, index, out_shape))


def _slice(ctx: _Lowering, node: Node) -> None:
    shape = list(ctx.shape(node.inputs[0]))
    axis = ctx.axis(int(node.attrs["axis"]), len(shape))  # type: ignore[arg-type]
    step = int(node.attrs["step"])  # type: ignore[arg-type]
    if step == 0:
        raise ctx.fail("step must not be 0")
    picked = range(*slice(node.attrs["start"], node.attrs["end"], step).indices(shape[axis]))
    out_shape = [*shape[:axis], len(picked), *shape[axis + 1:]]

    def read(index: list[Affine], _: list[Dim]) -> list[Affine]:
        return [index[a] * step + picked.start if a == axis else index[a] for a in range(len(shape))]

    _copy(ctx, node, out_shape, read)


def _gather(ctx: _Lowering, node: Node) -> None:
    x, idx = node.inputs
    shape, ishape = ctx.shape(x), ctx.shape(idx)
    axis = ctx.axis(int(node.attrs["axis"]), len(shape))  # type: ignore[arg-type]
    if ctx.dtype(idx).is_float:
        raise ctx.fail(f"index {idx} must be an integer tensor")
    out_shape = [*shape[:axis], *ishape, *shape[axis + 1:]]

    def read(index: list[Affine], _: list[Dim]) -> list[Affine]:
        picked = Affine.of(Indirect(idx, tuple(index[axis:axis + len(ishape)])))
        return [*index[:axis], picked, *index[axis + len(ishape):]]

    _copy(ctx, node, out_shape, read)


def _concat(ctx: _Lowering, node: Node) -> None:
    shapes = [ctx.shape(i) for i in node.inputs]
    axis = ctx.axis(int(node.attrs["axis"]), len(shapes[0]))  # type: ignore[arg-type]
    first = [n for a, n in enumerate(shapes[0]) if a != axis]
    for s in shapes:
        if len(s) != len(shapes[0]) or [n for a, n in enumerate(s) if a != axis] != first:
            raise ctx.fail(f"inputs of shapes {[list(s) for s in shapes]} differ off axis {axis}")
    out = ctx.expect(node, [*shapes[0][:axis], sum(s[axis] for s in shapes), *shapes[0][axis + 1:]])
    offset = 0
    for name, s in zip(node.inputs, shapes, strict=True):
        dims, index = ctx.dims(s)
        write = [e + offset if a == axis else e for a, e in enumerate(index)]
        ctx.emit(node.op, dims, out, write, ctx.load(name, index))
        offset += s[axis]


_RULES: dict[str, Callable[[_Lowering, Node], None]] = {
    **{op: _pointwise for op in (*UNARY, *BINARY, "gelu", "cast", "identity", "where")},
    "batch_norm": _batch_norm,
    **{op: _reduce for op in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min")},
    "softmax": _softmax,
    "log_softmax": _softmax,
    "layer_norm": _norm,
    "rms_norm": _norm,
    "nll_loss": _nll_loss,
    "matmul": _matmul,
    "conv2d": _conv2d,
    "max_pool2d": _pool,
    "avg_pool2d": _pool,
    "spmm": _spmm,
    "transpose": _transpose,
    "reshape": _reshape,
    "expand": _expand,
    "slice": _slice,
    "gather": _gather,
    "concat": _concat,
}
