"""Convolution programs a vendor library can run (the ``conv`` step), recognised from their loop nests.

A program is a *vendor convolution* when its first nest is the lowering of ``conv2d`` (``embed.lower``:
``out[.., g * cout_g + c, h, w] = sum x[.., g * cin_g + rc, h * sh + kh * dh - ph, w * sw + kw * dw - pw] *
w[g * cout_g + c, rc, kh, kw]``, extent-1 dims dropped) with symmetric padding, and every later nest is
pointwise over the same elements (:func:`pointwise_epilogue`): bias, batch-norm, activation, residual add. The
library computes the raw sum; the generated epilogue kernel (``transforms.codegen.vendor``) applies the conv
nest's own epilogue and every later nest. The parameters are read back from the index expressions and checked
by rebuilding them, so a recipe step can be regenerated and verified from the program alone.

    conv = match_convolution(program)   # None when the program is not such a convolution
    conv.stride, conv.padding, conv.dilation, conv.groups
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from embed.ir import DType
from embed.loopnest import Access, Affine, Call, Combiner, Load, LoopNest, LoopProgram
from transforms.contraction import row_major_store
from transforms.views import VIEWS, fold_views

#: Operand dtypes of the vendor paths (the raw sum is kept in the operand dtype, which must be the compute type).
VENDOR_CONV_DTYPES = (DType.FLOAT32, DType.FLOAT64)


@dataclass(frozen=True)
class Convolution:
    """A conv2d nest as the library takes it: input ``x`` [.., C, H, W], weight ``w`` [Cout, C / groups, KH, KW],
    the raw sum written as ``out`` ([.., Cout, OH, OW], row-major)."""

    program: LoopProgram
    x: str
    w: str
    out_shape: tuple[int, ...]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    dtype: DType


def _coefs(expr: Affine) -> dict[str, int] | None:
    """``expr``'s terms as {dim: coefficient}; None when an atom is not a plain dim."""
    if not all(isinstance(atom, str) for atom, _ in expr.terms):
        return None
    out: dict[str, int] = {}
    for atom, coef in expr.terms:
        out[str(atom)] = out.get(str(atom), 0) + coef
    return {d: c for d, c in out.items() if c}


def _single(coefs: dict[str, int], extent: int, dims: dict[str, int]) -> str | None | bool:
    """The one dim of ``coefs`` (coefficient 1, extent ``extent``); None when the dim was dropped (extent 1);
    False when it is neither."""
    if not coefs:
        return None if extent == 1 else False
    if len(coefs) != 1:
        return False
    (dim, coef), = coefs.items()
    return dim if coef == 1 and dims.get(dim) == extent else False


def match_convolution(program: LoopProgram) -> Convolution | None:
    """The vendor convolution ``program`` is once its views are folded (``transforms.views.fold_views``: a reshape
    of the result becomes the store's index map), or None; see the module docstring."""
    if not program.nests or program.nests[0].op != "conv2d":
        return None
    program = fold_views(program)
    nest = program.nests[0]
    st = nest.statement
    body = st.body
    if (st.combiner != Combiner.SUM or not isinstance(body, Call) or body.op != "mul" or len(body.args) != 2
            or not all(isinstance(a, Load) for a in body.args) or st.write.fill is not None
            or any(d.ragged for d in nest.dims)):
        return None
    x_access, w_access = (a.access for a in body.args if isinstance(a, Load))
    buffers = program.buffers
    x_shape, w_shape = buffers[x_access.tensor].shape, buffers[w_access.tensor].shape
    dtype = buffers[x_access.tensor].dtype
    if (len(w_shape) != 4 or len(x_shape) not in (3, 4) or w_access.fill is not None or dtype not in VENDOR_CONV_DTYPES
            or buffers[w_access.tensor].dtype != dtype
            or any(b.dtype == DType.FLOAT64 for b in buffers.values()) and dtype != DType.FLOAT64):
        return None
    cout, cin_g, kh, kw = w_shape
    *lead, channels, height, width = x_shape
    if channels % cin_g or cout % (channels // cin_g):
        return None
    groups = channels // cin_g
    cout_g = cout // groups
    par = {d.name: d.extent for d in nest.parallel}
    red = {d.name: d.extent for d in nest.reduction}
    xs = [_coefs(e) for e in x_access.index]
    ws = [_coefs(e) for e in w_access.index]
    if any(c is None for c in (*xs, *ws)) or any(e.const for e in w_access.index):
        return None
    rc, rkh, rkw = (_single(ws[i], n, red) for i, n in ((1, cin_g), (2, kh), (3, kw)))
    if False in (rc, rkh, rkw) or {rc, rkh, rkw} - {None} != set(red) or len(red) != len({rc, rkh, rkw} - {None}):
        return None
    # the output channel: the group's dim (coefficient cout_g) and the channel within it
    co = ws[0]
    group = next((d for d, c in co.items() if groups > 1 and c == cout_g and par.get(d) == groups), None)
    inner = [d for d in co if d != group]
    if (len(inner) > 1 or inner and (co[inner[0]] != 1 or par.get(inner[0]) != cout_g)
            or not inner and cout_g != 1 or groups > 1 and group is None):
        return None
    expected_channel = ({group: cin_g} if group else {}) | ({rc: 1} if rc else {})
    if xs[-3] != expected_channel or x_access.index[-3].const:
        return None
    lead_dims = []
    for e, extent in zip(xs[:-3], lead, strict=True):
        d = _single(e, extent, par)
        if d is False or (e and x_access.index[len(lead_dims)].const):
            return None
        lead_dims.append(d)
    windows, out_dims = [], []
    for axis, k_dim, size, k in ((-2, rkh, height, kh), (-1, rkw, width, kw)):
        coefs = dict(xs[axis])
        pad = -x_access.index[axis].const
        dilation = coefs.pop(k_dim, 0) if k_dim else 1
        if len(coefs) > 1 or coefs and next(iter(coefs)) not in par:
            return None
        out_dim, stride = next(iter(coefs.items()), (None, 0))
        out_size = par[out_dim] if out_dim else 1
        if not out_dim:  # one output row: any stride that leaves one, the smallest
            stride = max(1, size + 2 * pad - dilation * (k - 1))
        if (stride < 1 or dilation < 1 or pad < 0
                or (size + 2 * pad - dilation * (k - 1) - 1) // stride + 1 != out_size):
            return None
        windows.append((stride, pad, dilation, out_size))
        out_dims.append(out_dim)
    if any(w[1] for w in windows) and x_access.fill != 0.0:
        return None
    # the parallel dims, outer -> inner, are those of an NCHW result: lead, group, channel, rows, columns
    order = [d for d in (*lead_dims, group, *inner, *out_dims) if d]
    out_shape = (*lead, cout, windows[0][3], windows[1][3])
    if (order != [d.name for d in nest.parallel] or math.prod(out_shape) != nest.parallel_iterations
            or buffers[st.write.tensor].numel != nest.parallel_iterations or not row_major_store(program, nest)
            or not pointwise_epilogue(program)):
        return None
    (sh, ph, dh, _), (sw, pw, dw, _) = windows
    return Convolution(program, x_access.tensor, w_access.tensor, out_shape, (sh, sw), (ph, pw), (dh, dw), groups,
                       dtype)


def _flat(access: Access, program: LoopProgram, nest: LoopNest) -> tuple[int, ...] | None:
    """The element strides of ``access`` along ``nest``'s parallel dims (None when not plain affine)."""
    if access.fill is not None or any(not all(isinstance(a, str) for a, _ in e.terms) or e.const for e in access.index):
        return None
    shape = program.buffers[access.tensor].shape
    strides = [access.stride(d.name, shape) for d in nest.parallel]
    return None if any(s is None for s in strides) else tuple(int(s) for s in strides)  # type: ignore[arg-type]


def _row_major(nest: LoopNest) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(nest.parallel):
        strides.append(acc)
        acc *= d.extent
    return tuple(reversed(strides))


def pointwise_epilogue(program: LoopProgram) -> bool:
    """Every nest after the first is pointwise over as many elements as the first writes, stores row-major over
    its own dims, and reads what an earlier nest wrote only at its own element (the same flat offset), so that
    one thread per element can run them all on the first nest's value."""
    first = program.nests[0]
    total = first.parallel_iterations
    written = {first.statement.write.tensor: first}
    for nest in program.nests[1:]:
        st = nest.statement
        view = nest.op in VIEWS and isinstance(st.body, Load) and st.body.access == (
            written[st.body.access.tensor].statement.write if st.body.access.tensor in written else None)
        if (st.combiner is not None or nest.reduction or nest.parallel_iterations != total
                or any(d.ragged for d in nest.dims) or st.write.tensor in written
                or not (view or row_major_store(program, nest))):
            return False
        own = _row_major(nest)
        for access in st.loads():
            writer = written.get(access.tensor)
            if writer is None:
                continue
            same = access == writer.statement.write and writer.parallel == nest.parallel
            if not same and (_flat(access, program, nest) != own or _flat(writer.statement.write, program, writer)
                             != _row_major(writer)):
                return False
        written[st.write.tensor] = nest
    return math.prod(d.extent for d in first.parallel) == total
