"""Layout views of computed values folded into the store of the nest that computes them (``fold_views``).

A reshape or transpose lowers to a copy nest over the view's shape (``embed.lower``): ``matmul+add+reshape`` is then
not "a matmul, then pointwise nests over its output", and the contraction would leave the GEMM family for a generic
kernel that also copies. ``fold_views`` rewrites each view of a value computed in the program into the domain of the
nest that computes it: the view reads the value at the element being computed and stores it where the view puts it
(an index map, with ``//`` and ``%`` where shapes split or merge), so the layout is the epilogue's store and no copy
runs. Where the map keeps every element at its row-major offset (a reshape: head splits, flattening) and nothing else
reads the value, the computing nest writes the view's buffer itself, so a vendor GEMM can write it too.

    program = fold_views(lower(graph))  # the same object when there is nothing to fold

Buffers are kept (a folded-away temporary stays declared, unused), so a kernel's arguments do not change.

``fold_loads`` is the other side: a copy nest that only reads what the program does not compute (a layout op on the
kernel's input: transpose, reshape, slice, expand) is removed, and every later read of the copy reads the source
through the copy's index map instead (``softmax(transpose(x))`` reads ``x[j, i]`` for element ``[i, j]``).
``fold_layout`` is both, the program a plan's kernel with folded layout steps runs (``transforms.plan``).

``merge_inner_dims`` is a view of the loops rather than of a buffer: each nest's two innermost parallel dims become
one whose digits index what they indexed, so a 1x1 convolution over ``[n, o, h, w]`` is a batched GEMM over
``[n, o, h * w]`` (``transforms.contraction``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from embed.loopnest import (
    Access,
    Affine,
    BufferKind,
    Dim,
    Expr,
    FloorDiv,
    Indirect,
    Load,
    LoopNest,
    LoopProgram,
    Mod,
    Statement,
    floordiv,
    map_leaves,
    mod,
)
from embed.subgraph import SubgraphKind

VIEWS = ("reshape", "transpose")  # copy nests that only move elements, one to one
COPIES = ("reshape", "transpose", "slice", "expand")  # copy nests a reader can read through (fold_loads)


def kernel_program(program: LoopProgram, kind: SubgraphKind | None, *, fold: bool = False) -> LoopProgram:
    """The program the kernels of a subgraph of ``kind`` are generated from: with ``fold`` (a plan's kernel step
    with layout steps folded into it) its views and input copies folded (:func:`fold_layout`); for a row reduction
    its views folded (:func:`fold_views`): unfolded, a reshape after the reduction is a nest over the view's shape,
    and the kernel's rows would follow that nest's leading axis (4 blocks for a layer norm over 12544 rows of 128,
    1.2 ms on an H200), and its two inner reduction dims merged where that makes it rows (:func:`_rows_merged`).
    Other kinds keep their program, and so the recipes their recordings hold."""
    if fold:
        program = fold_layout(program)
    elif kind == SubgraphKind.REDUCTION:
        program = fold_views(program)
    return _rows_merged(program) if kind == SubgraphKind.REDUCTION else program


def _rows_merged(program: LoopProgram) -> LoopProgram:
    """A reduction over two inner dims as one over a row of their product (:func:`merge_inner_dims` with
    ``reductions``), where only that makes the program's groups rows the row kernels take: a global average pool
    and its pointwise prologue (MobileNet's batch norm and relu6 before its squeeze-excite mean) then run as one pass
    with the prologue's values in registers, not as a nest at a time through scratch."""
    from transforms.codegen.cuda_rows import has_row_groups  # codegen plans on the programs made here

    if has_row_groups(program):
        return program
    merged = merge_inner_dims(program, reductions=True)
    return merged if merged is not None and has_row_groups(merged) else program


def fold_layout(program: LoopProgram) -> LoopProgram:
    """``program`` with views of computed values folded into their producers' stores (:func:`fold_views`), then
    copies of its inputs folded into their readers' loads (:func:`fold_loads`)."""
    return fold_loads(fold_views(program))


def fold_loads(program: LoopProgram) -> LoopProgram:
    """``program`` without the copy nests of values it does not compute: each later read of such a copy reads the
    copy's source through the copy's index map (module docstring). The copy's buffer stays declared."""
    return _fold_each(program, _fold_load)


def _fold_load(program: LoopProgram, nests: list[LoopNest], j: int) -> list[LoopNest] | None:
    """``nests`` without copy ``j``, its later readers reading its source; None when ``j`` is no such copy."""
    mapping = _load_map(program, nests, j)
    if mapping is None:
        return None
    view = nests[j]
    source = view.statement.body.access  # type: ignore[union-attr]
    out = view.statement.write.tensor
    return nests[:j] + [_read_through(n, out, source, mapping) for n in nests[j + 1:]]


def _fold_each(program: LoopProgram,
               fold_at: Callable[[LoopProgram, list[LoopNest], int], list[LoopNest] | None]) -> LoopProgram:
    """``program`` with ``fold_at`` applied at each nest in program order (a fold may remove or merge nests: the
    nest then at the same place is tried next)."""
    nests = list(program.nests)
    j = 0
    while j < len(nests):
        folded = fold_at(program, nests, j)
        if folded is None:
            j += 1
        else:
            nests = folded
    return program if tuple(nests) == program.nests else replace(program, nests=tuple(nests))


def _load_map(program: LoopProgram, nests: list[LoopNest], j: int) -> list[str | None] | None:
    """Per axis of the copy ``j`` writes, the dim that indexes it (None: a size-1 axis at 0), when ``j`` is a copy
    of a value no nest computes into a temporary only later nests read, directly and in bounds; else None."""
    view = nests[j]
    st = view.statement
    if (view.op not in COPIES or st.combiner is not None or st.epilogue is not None or not isinstance(st.body, Load)
            or st.body.access.fill is not None or view.reduction or any(d.ragged for d in view.dims)):
        return None
    out, source = st.write.tensor, st.body.access.tensor
    written = [n.statement.write.tensor for n in nests]
    if program.buffers[out].kind != BufferKind.TEMP or source in written or written.count(out) != 1:
        return None
    axes: list[str | None] = []
    for e, n in zip(st.write.index, program.buffers[out].shape, strict=True):
        if not e.terms and not e.const and n == 1:
            axes.append(None)
        elif len(e.terms) == 1 and not e.const and e.terms[0][1] == 1 and isinstance(e.terms[0][0], str):
            axes.append(e.terms[0][0])
        else:
            return None
    named = [a for a in axes if a is not None]
    if sorted(named) != sorted(d.name for d in view.parallel if d.extent > 1 or d.name in named) or len(set(named)) \
            != len(named):
        return None
    for k, n in enumerate(nests):
        reads = [a for a in n.loads() if a.tensor == out]
        if reads and (k < j or any(a.fill is not None for a in reads) or _indirectly_read(n, out)):
            return None
    return axes


def _indirectly_read(nest: LoopNest, tensor: str) -> bool:
    exprs = [*nest.statement.write.index, *(e for a in nest.loads() for e in a.index)]
    return any(i.tensor == tensor for e in exprs for i in e.indirects())


def _read_through(nest: LoopNest, out: str, source: Access, axes: Sequence[str | None]) -> LoopNest:
    def leaf(e: Expr) -> Expr:
        if not (isinstance(e, Load) and e.access.tensor == out):
            return e
        values = {a: i for a, i in zip(axes, e.access.index, strict=True) if a is not None}
        return Load(Access(source.tensor, tuple(_substituted(i, values) for i in source.index)))

    st = nest.statement
    epilogue = None if st.epilogue is None else map_leaves(st.epilogue, leaf)
    return replace(nest, statement=replace(st, body=map_leaves(st.body, leaf), epilogue=epilogue))


def _substituted(expr: Affine, values: Mapping[str, Affine]) -> Affine:
    """``expr`` with each dim in ``values`` replaced by its expression (a dim not in ``values`` is 0: a size-1 axis
    of the copy)."""
    out = Affine((), expr.const)
    for atom, coef in expr.terms:
        if isinstance(atom, str):
            out = out + values.get(atom, Affine()) * coef
        elif isinstance(atom, Indirect):
            out = out + Affine.of(Indirect(atom.tensor, tuple(_substituted(i, values) for i in atom.index)), coef)
        else:
            out = out + Affine.of(replace(atom, arg=_substituted(atom.arg, values)), coef)
    return out


def merge_inner_dims(program: LoopProgram, *, reductions: bool = False) -> LoopProgram | None:
    """``program`` with the two innermost parallel dims ``h`` (outer) and ``w`` of each nest merged into one dim
    ``q`` over ``h * w`` points, every index reading ``h`` as ``q // W`` and ``w`` as ``q % W``: the same points in the
    same order, on the same buffers. The merged dim keeps the inner one's name; the outer dims of its kind move down
    a role. With ``reductions``, a nest that reduces merges its two innermost reduction dims instead (a mean over
    ``h`` and ``w`` is one over ``h * w``). None when a nest has fewer than two such dims, an empty one to merge, or a
    ragged dim."""
    nests = []
    for nest in program.nests:
        par, red = nest.parallel, nest.reduction
        merging = red if reductions and red else par
        if len(merging) < 2 or any(d.ragged for d in nest.dims) or min(d.extent for d in merging[-2:]) < 1:
            return None
        outer, inner = merging[-2], merging[-1]
        q = replace(inner, extent=outer.extent * inner.extent)
        extents = {q.name: q.extent}
        values = {d.name: Affine.of(d.name) for d in nest.dims} | {
            outer.name: floordiv(Affine.of(q.name), inner.extent, extents),
            inner.name: mod(Affine.of(q.name), inner.extent, extents)}
        kept = [*merging[:-2], q]
        prefix = "r" if merging is red else "p"
        roles = {d.name: f"{prefix}{len(kept) - 1 - i}" for i, d in enumerate(kept)}
        dims = [replace(d, name=roles[d.name]) for d in kept]
        dims = [*par, *dims] if merging is red else [*dims, *red]
        statement = _substituted_statement(nest.statement, values).rename(roles)
        nests.append(LoopNest(nest.op, tuple(dims), statement))
    return replace(program, nests=tuple(nests))


def _substituted_statement(st: Statement, values: Mapping[str, Affine]) -> Statement:
    """``st`` with every index (stores, loads, indirect reads) through :func:`_substituted`."""
    def access(a: Access) -> Access:
        return replace(a, index=tuple(_substituted(i, values) for i in a.index))

    def leaf(e: Expr) -> Expr:
        return Load(access(e.access)) if isinstance(e, Load) else e

    epilogue = None if st.epilogue is None else map_leaves(st.epilogue, leaf)
    return replace(st, write=access(st.write), body=map_leaves(st.body, leaf), epilogue=epilogue)


def fold_views(program: LoopProgram) -> LoopProgram:
    """``program`` with each foldable view folded (module docstring), in program order."""
    return _fold_each(program, _fold)


def _fold(program: LoopProgram, nests: list[LoopNest], j: int) -> list[LoopNest] | None:
    """``nests`` with view ``j`` moved into the domain of the nest computing what it reads (or merged into that
    nest's store); None when ``j`` is not such a view or is one already."""
    view, buffers = nests[j], program.buffers
    st = view.statement
    if (view.op not in VIEWS or st.combiner is not None or not isinstance(st.body, Load) or st.body.access.fill
            is not None or any(d.ragged for d in view.dims) or view.reduction):
        return None
    source, out = st.body.access.tensor, st.write.tensor
    writers = [i for i, n in enumerate(nests) if n.statement.write.tensor == source]
    if len(writers) != 1 or writers[0] >= j or [n.statement.write.tensor for n in nests].count(out) != 1:
        return None
    i = writers[0]
    producer = nests[i]
    domain = producer.parallel
    size = math.prod(d.extent for d in domain)
    if (size != buffers[source].numel or size != buffers[out].numel or any(d.ragged for d in producer.dims)
            or not _row_major_plain(st.write, buffers[out].shape, view.parallel)):
        return None
    at = producer.statement.write.index
    if st.body.access.index == at and view.parallel == domain:
        return None  # folded already
    index = _moved(view, at, buffers[source].shape, buffers[out].shape, {d.name: d.extent for d in domain})
    if index is None:
        return None
    store = Access(out, index)
    readers = sum(x.tensor == source for n in nests for x in n.loads())
    if buffers[source].kind == BufferKind.TEMP and readers == 1 and keeps_order(store, buffers[out].shape, domain):
        merged = replace(producer, statement=replace(producer.statement, write=store))
        return [*nests[:i], merged, *nests[i + 1:j], *nests[j + 1:]]
    moved = LoopNest(view.op, domain, Statement(store, Load(Access(source, at))))
    return [*nests[:j], moved, *nests[j + 1:]]


def _moved(view: LoopNest, at: Sequence[Affine], shape: Sequence[int], out_shape: Sequence[int],
           extents: Mapping[str, int]) -> tuple[Affine, ...] | None:
    """Where ``view`` stores the element its source holds at index ``at``, or None."""
    if view.op == "reshape":  # the same row-major offset in the view's shape
        flat = Affine()
        for e, s in zip(at, _strides(shape), strict=True):
            flat = flat + e * s
        return tuple(mod(floordiv(flat, s, extents), n, extents) for s, n in zip(_strides(out_shape), out_shape,
                                                                                  strict=True))
    read, written = view.statement.body.access.index, view.statement.write.index  # type: ignore[union-attr]
    index = []
    for w in written:  # a transpose reads axis a of its source at the dim that indexes one axis of its output
        if not w.terms:
            index.append(Affine())
            continue
        axis = next((a for a, r in enumerate(read) if r == w), None)
        if axis is None:
            return None
        index.append(at[axis])
    return tuple(index)


def _strides(shape: Sequence[int]) -> list[int]:
    return [math.prod(shape[a + 1:]) for a in range(len(shape))]


def _row_major_plain(access: Access, shape: Sequence[int], dims: Sequence[Dim]) -> bool:
    """``access`` indexes ``shape`` by ``dims`` in order, one plain dim per axis (size-1 axes: 0)."""
    named = [e for e, n in zip(access.index, shape, strict=True) if n != 1]
    return (all(not e.terms and not e.const for e, n in zip(access.index, shape, strict=True) if n == 1)
            and named == [Affine.of(d.name) for d in dims])


def keeps_order(access: Access, shape: Sequence[int], dims: Sequence[Dim]) -> bool:
    """Whether ``access`` stores every point of ``dims`` at its row-major offset in a buffer of ``shape`` (a plain
    row-major write, or one through a reshape's index map).

    Each dim is moved over its whole range with the others at 0: exact for the maps ``fold_views`` makes, whose
    offsets are sums over the mixed-radix digits of the dims (a digit out of place shows when it alone is 1)."""
    if math.prod(shape) != math.prod(d.extent for d in dims) or any(d.ragged for d in dims):
        return False
    expected = _strides([d.extent for d in dims])
    for d, stride in zip(dims, expected, strict=True):
        values = {x.name: np.zeros(1, np.int64) for x in dims} | {d.name: np.arange(d.extent, dtype=np.int64)}
        offset = np.zeros(1, np.int64)
        for e, s in zip(access.index, _strides(shape), strict=True):
            value = _value(e, values)
            if value is None:
                return False
            offset = offset + value * s
        if not np.array_equal(np.broadcast_to(offset, (d.extent,)), values[d.name] * stride):
            return False
    return True


def _value(expr: Affine, values: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """``expr`` at the points ``values`` gives; None through an indirect read or a dim not in ``values``."""
    out = np.full(1, expr.const, np.int64)
    for atom, coef in expr.terms:
        if isinstance(atom, str):
            term = values.get(atom)
        elif isinstance(atom, FloorDiv | Mod):
            arg = _value(atom.arg, values)
            term = None if arg is None else arg // atom.divisor if isinstance(atom, FloorDiv) else arg % atom.modulus
        else:
            term = None
        if term is None:
            return None
        out = out + coef * term
    return out
