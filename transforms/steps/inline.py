"""``inline(gather|none)`` (cuda): compute a pointwise temporary where a gather reads it instead of storing it.

A nest ``t[p..] = f(...)`` writing a whole temporary that is read only by later nests that each touch at most
1/:data:`SPARSE` of it (``nll_loss`` picking one log-probability per row) is removed, and each read
``t[e..]`` becomes ``f`` with ``p := e``: log_softmax + nll_loss then never writes the log-probabilities."""

from __future__ import annotations

from dataclasses import replace

from embed.loopnest import (
    Access,
    Affine,
    BufferKind,
    Expr,
    Indirect,
    Load,
    LoopNest,
    LoopProgram,
    Statement,
    map_leaves,
)
from transforms.recipe import Step
from transforms.schedule import Schedule
from transforms.transformation import Transformation, expect_ident

SPARSE = 8
MODES = ("gather", "none")


def _subst(e: Affine, values: dict[str, Affine]) -> Affine:
    out = Affine((), e.const)
    for atom, coef in e.terms:
        if isinstance(atom, str):
            out = out + (values[atom] * coef if atom in values else Affine.of(atom, coef))
        elif isinstance(atom, Indirect):
            out = out + Affine.of(Indirect(atom.tensor, tuple(_subst(i, values) for i in atom.index)), coef)
        else:
            out = out + Affine.of(replace(atom, arg=_subst(atom.arg, values)), coef)
    return out


def _subst_expr(expr: Expr, values: dict[str, Affine]) -> Expr:
    def leaf(e: Expr) -> Expr:
        if not isinstance(e, Load):
            return e
        a = e.access
        return Load(Access(a.tensor, tuple(_subst(i, values) for i in a.index), a.fill))

    return map_leaves(expr, leaf)


def _replace_reads(expr: Expr, producer: LoopNest) -> Expr:
    write = producer.statement.write

    def leaf(e: Expr) -> Expr:
        if not (isinstance(e, Load) and e.access.tensor == write.tensor):
            return e
        dims = [next(iter(i.dims())) for i in write.index]
        return _subst_expr(producer.statement.body, dict(zip(dims, e.access.index, strict=True)))

    return map_leaves(expr, leaf)


def _inlinable(program: LoopProgram, i: int) -> bool:
    nest = program.nests[i]
    st = nest.statement
    buf = program.buffers[st.write.tensor]
    plain = all(len(e.terms) == 1 and e.const == 0 and isinstance(e.terms[0][0], str) and e.terms[0][1] == 1
                for e in st.write.index)
    if st.combiner is not None or buf.kind != BufferKind.TEMP or not plain or len(st.write.index) != len(nest.dims):
        return False
    inputs = {a.tensor for a in st.loads()}
    readers = [j for j, n in enumerate(program.nests) if any(a.tensor == buf.name for a in n.loads())]
    return bool(readers) and all(
        j > i and program.nests[j].iterations * SPARSE <= buf.numel
        and not any(a.fill is not None for a in program.nests[j].loads() if a.tensor == buf.name)
        and not any(program.nests[k].statement.write.tensor in inputs for k in range(i + 1, j))
        for j in readers)


def inline_gathers(program: LoopProgram) -> LoopProgram:
    """``program`` with every gathered pointwise temporary computed at its reads (see the module docstring)."""
    nests = list(program.nests)
    i = 0
    while i < len(nests):
        current = replace(program, nests=tuple(nests))
        if not _inlinable(current, i):
            i += 1
            continue
        producer = nests.pop(i)
        for j, n in enumerate(nests):
            st = n.statement
            body = _replace_reads(st.body, producer)
            epilogue = None if st.epilogue is None else _replace_reads(st.epilogue, producer)
            nests[j] = replace(n, statement=Statement(st.write, body, st.combiner, epilogue))
    return replace(program, nests=tuple(nests))


class Inline(Transformation):
    name = "inline"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        if backend != "cuda" or not any(_inlinable(program, i) for i in range(len(program.nests))):
            return []
        return [[Step("inline", (m,)) for m in MODES]]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        if expect_ident(step, 0, MODES) == "none":
            return schedule
        return schedule.set(program=inline_gathers(schedule.program))


STEP = Inline()
