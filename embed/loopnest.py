"""Loop nests: the iteration-domain form of a subgraph, from which features and code are derived.

A subgraph lowers (``embed.lower``) to a ``LoopProgram``: buffers (inputs, params, small consts,
temporaries, outputs) and an ordered list of ``LoopNest``s. Each nest holds one ``Statement``::

    for <parallel dims>:                 # outer -> inner: p_{n-1} ... p0
        acc = identity(combiner)
        for <reduction dims>:            # r_{m-1} ... r0
            acc = combiner(acc, body)
        write = epilogue(acc)            # or write = body when the nest has no reduction

Nests are unfused: a softmax is a max nest, an exp-sum nest and a normalize nest writing through
temporary buffers. Fusing them is a transformation (``transforms``), not the lowering's job. Writes
are affine in the parallel dims and injective (each element of a nest's write region is written
once), and no nest reads the buffer it writes, so parallel dims can be split and bound freely.

Index expressions are *quasi-affine*: ``Affine`` is ``const + sum(coef * atom)`` where an atom is
a dimension name, ``FloorDiv``/``Mod`` of an ``Affine`` by a constant (non-affine reshapes) or an
``Indirect`` read of an integer tensor (gather, nll_loss targets, CSR column indices). An access
with ``fill`` set may leave the tensor's bounds and then reads ``fill`` (zero padding of conv2d,
-inf padding of max_pool2d); every other access stays in bounds by construction.

Sparse products are ragged reductions: a reduction dimension may carry a ``Ragged`` range whose
bounds are read from a tensor, e.g. spmm's ``for r0 in [indptr[p1], indptr[p1 + 1])``. Its
``extent`` is then the mean extent (nnz / rows, rounded up), used by the static features.

Dimension roles (the names recipes use): ``p0`` is the parallel dimension with the smallest stride
in the written tensor (stride 1 for a row-major output), ``p1`` the next, ...; ``r0`` is the
reduction dimension with the smallest non-zero stride over the loads, ``r1`` the next, ...
Dimensions are named by their role.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar

from embed.ir import DType


class DimKind(StrEnum):
    PARALLEL = "parallel"
    REDUCTION = "reduction"


class Combiner(StrEnum):
    SUM = "sum"
    MAX = "max"
    MIN = "min"

    @property
    def identity(self) -> float:
        return {Combiner.SUM: 0.0, Combiner.MAX: -math.inf, Combiner.MIN: math.inf}[self]


class BufferKind(StrEnum):
    INPUT = "input"
    PARAM = "param"
    CONST = "const"
    TEMP = "temp"
    OUTPUT = "output"


# ---------------------------------------------------------------------------------------------
# Index expressions


@dataclass(frozen=True)
class FloorDiv:
    """``arg // divisor`` (floor division, divisor > 0)."""

    arg: Affine
    divisor: int

    def __str__(self) -> str:
        return f"({_group(self.arg)} // {self.divisor})"


@dataclass(frozen=True)
class Mod:
    """``arg % modulus`` (modulus > 0, result in [0, modulus))."""

    arg: Affine
    modulus: int

    def __str__(self) -> str:
        return f"({_group(self.arg)} % {self.modulus})"


@dataclass(frozen=True)
class Indirect:
    """An index read from an integer tensor: ``tensor[index...]``."""

    tensor: str
    index: tuple[Affine, ...]

    def __str__(self) -> str:
        return f"{self.tensor}[{', '.join(map(str, self.index))}]"


def _group(arg: Affine) -> str:
    return f"({arg})" if len(arg.terms) + bool(arg.const) > 1 else str(arg)


Atom = str | FloorDiv | Mod | Indirect


@dataclass(frozen=True)
class Affine:
    """``const + sum(coef * atom)``; an atom is a dimension name or a FloorDiv/Mod/Indirect."""

    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(atom: Atom, coef: int = 1) -> Affine:
        return Affine(((atom, coef),)) if coef else Affine()

    def __add__(self, other: Affine | int) -> Affine:
        if isinstance(other, int):
            return Affine(self.terms, self.const + other)
        coefs: dict[Atom, int] = dict(self.terms)
        for atom, coef in other.terms:
            coefs[atom] = coefs.get(atom, 0) + coef
        return Affine(tuple((a, c) for a, c in coefs.items() if c), self.const + other.const)

    def __mul__(self, k: int) -> Affine:
        if k == 0:
            return Affine()
        return Affine(tuple((a, c * k) for a, c in self.terms), self.const * k)

    def dims(self) -> frozenset[str]:
        """Dimension names this expression depends on (through any atom)."""
        out: set[str] = set()
        for atom, _ in self.terms:
            if isinstance(atom, str):
                out.add(atom)
            elif isinstance(atom, Indirect):
                for e in atom.index:
                    out |= e.dims()
            else:
                out |= atom.arg.dims()
        return frozenset(out)

    def indirects(self) -> Iterator[Indirect]:
        """Every Indirect read inside, innermost first."""
        for atom, _ in self.terms:
            if isinstance(atom, Indirect):
                for e in atom.index:
                    yield from e.indirects()
                yield atom
            elif isinstance(atom, FloorDiv | Mod):
                yield from atom.arg.indirects()

    def rename(self, names: Mapping[str, str]) -> Affine:
        return Affine(tuple((_rename_atom(a, names), c) for a, c in self.terms), self.const)

    def __str__(self) -> str:
        parts = [str(a) if c == 1 else f"{a}*{c}" for a, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")


def _rename_atom(atom: Atom, names: Mapping[str, str]) -> Atom:
    if isinstance(atom, str):
        return names.get(atom, atom)
    if isinstance(atom, Indirect):
        return Indirect(atom.tensor, tuple(e.rename(names) for e in atom.index))
    return replace(atom, arg=atom.arg.rename(names))


def index_range(expr: Affine, extents: Mapping[str, int]) -> tuple[int, int] | None:
    """Inclusive [min, max] of ``expr`` over the dims' ranges [0, extent); None when data-dependent."""
    lo = hi = expr.const
    for atom, coef in expr.terms:
        r = _atom_range(atom, extents)
        if r is None:
            return None
        a, b = r[0] * coef, r[1] * coef
        lo, hi = lo + min(a, b), hi + max(a, b)
    return lo, hi


def _atom_range(atom: Atom, extents: Mapping[str, int]) -> tuple[int, int] | None:
    if isinstance(atom, str):
        return (0, extents[atom] - 1) if atom in extents else None
    if isinstance(atom, Indirect):
        return None
    if isinstance(atom, FloorDiv):
        r = index_range(atom.arg, extents)
        return None if r is None else (r[0] // atom.divisor, r[1] // atom.divisor)
    r = index_range(atom.arg, extents)
    if r is not None and r[0] >= 0 and r[1] < atom.modulus:
        return r
    return 0, atom.modulus - 1


def floordiv(expr: Affine, d: int, extents: Mapping[str, int]) -> Affine:
    """``expr // d`` simplified: terms whose coefficient ``d`` divides leave the division."""
    if d == 1:
        return expr
    high = Affine(tuple((a, c // d) for a, c in expr.terms if c % d == 0), expr.const // d)
    rest = Affine(tuple((a, c) for a, c in expr.terms if c % d), expr.const % d)
    r = index_range(rest, extents)
    if r is not None and r[0] >= 0 and r[1] < d:
        return high
    return high + Affine.of(FloorDiv(rest, d))


def mod(expr: Affine, m: int, extents: Mapping[str, int]) -> Affine:
    """``expr % m`` simplified: coefficients reduced mod ``m`` (multiples drop out); no-op when in range."""
    rest = Affine(tuple((a, c % m) for a, c in expr.terms if c % m), expr.const % m)
    r = index_range(rest, extents)
    if r is not None and r[0] >= 0 and r[1] < m:
        return rest
    return Affine.of(Mod(rest, m))


def without_splits(expr: Affine) -> Affine:
    """``expr`` with each ``A % m`` written ``A - m * (A // m)`` and each ``(A // a) // b`` as ``A // (a * b)`` (equal
    for every integer ``A``), so that the digits of an index merged again cancel to the index: what a reshape's
    flattening leaves in a row-major offset, e.g. ``12 * (i // 12) + 3 * ((i // 3) % 4) + i % 3`` is ``i``."""
    total = Affine((), expr.const)
    for atom, coef in expr.terms:
        if isinstance(atom, Mod):
            arg = without_splits(atom.arg)
            total = total + (arg + Affine.of(_divided(arg, atom.modulus), -atom.modulus)) * coef
        elif isinstance(atom, FloorDiv):
            total = total + Affine.of(_divided(without_splits(atom.arg), atom.divisor), coef)
        else:
            total = total + Affine.of(atom, coef)
    return total


def _divided(arg: Affine, d: int) -> FloorDiv:
    if not arg.const and len(arg.terms) == 1 and arg.terms[0][1] == 1 and isinstance(arg.terms[0][0], FloorDiv):
        inner = arg.terms[0][0]
        return FloorDiv(inner.arg, inner.divisor * d)
    return FloorDiv(arg, d)


def index_stride(expr: Affine, dim: str) -> float | None:
    """d(expr)/d(dim): the step of ``expr`` when ``dim`` grows by one; None through an Indirect."""
    total = 0.0
    for atom, coef in expr.terms:
        if isinstance(atom, str):
            total += coef if atom == dim else 0
        elif isinstance(atom, Indirect):
            if any(dim in e.dims() for e in atom.index):
                return None
        else:
            inner = index_stride(atom.arg, dim)
            if inner is None:
                return None
            total += coef * inner / (atom.divisor if isinstance(atom, FloorDiv) else 1)
    return total


# ---------------------------------------------------------------------------------------------
# Accesses and compute expressions


@dataclass(frozen=True)
class Access:
    """``tensor[index...]``; with ``fill`` set, out-of-bounds reads yield ``fill`` (padding)."""

    tensor: str
    index: tuple[Affine, ...]
    fill: float | None = None

    def dims(self) -> frozenset[str]:
        return frozenset().union(*(e.dims() for e in self.index))

    def rename(self, names: Mapping[str, str]) -> Access:
        return replace(self, index=tuple(e.rename(names) for e in self.index))

    def offset(self, shape: Sequence[int]) -> Affine:
        """The element offset in the row-major ``tensor`` of ``shape`` as one expression."""
        total = Affine()
        for e, s in zip(self.index, _row_major_strides(shape), strict=True):
            total = total + e * s
        return total

    def stride(self, dim: str, shape: Sequence[int]) -> float | None:
        """Elements stepped in the row-major ``tensor`` when ``dim`` grows by one; None if indirect."""
        total = 0.0
        for e, s in zip(self.index, _row_major_strides(shape), strict=True):
            d = index_stride(e, dim)
            if d is None:
                return None
            total += d * s
        return total

    def __str__(self) -> str:
        pad = f" (else {self.fill})" if self.fill is not None else ""
        return f"{self.tensor}[{', '.join(map(str, self.index))}]{pad}"


def _row_major_strides(shape: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return strides[::-1]


@dataclass(frozen=True)
class Load:
    access: Access

    def __str__(self) -> str:
        return str(self.access)


@dataclass(frozen=True)
class Const:
    value: float

    def __str__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class Call:
    """A pointwise op of ``embed.ops`` (plus ``gelu_tanh``) applied to its arguments."""

    op: str
    args: tuple[Expr, ...]

    def __str__(self) -> str:
        if self.op in _INFIX:
            return f"({self.args[0]} {_INFIX[self.op]} {self.args[1]})"
        return f"{self.op}({', '.join(map(str, self.args))})"


@dataclass(frozen=True)
class Cast:
    """Convert to ``dtype`` (float -> int truncates toward zero, -> bool is ``!= 0``)."""

    dtype: DType
    arg: Expr

    def __str__(self) -> str:
        return f"{self.dtype.value}({self.arg})"


@dataclass(frozen=True)
class Acc:
    """The reduced value, inside a statement's epilogue."""

    def __str__(self) -> str:
        return "acc"


Expr = Load | Const | Call | Cast | Acc
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


def walk(expr: Expr) -> Iterator[Expr]:
    """Every node of ``expr``, parents before children."""
    yield expr
    for child in _children(expr):
        yield from walk(child)


def _children(expr: Expr) -> tuple[Expr, ...]:
    if isinstance(expr, Call):
        return expr.args
    if isinstance(expr, Cast):
        return (expr.arg,)
    return ()


def map_leaves(expr: Expr, leaf: Callable[[Expr], Expr]) -> Expr:
    """``expr`` rebuilt with every leaf (anything but a Call or Cast) replaced by ``leaf(node)``."""
    if isinstance(expr, Call):
        return Call(expr.op, tuple(map_leaves(a, leaf) for a in expr.args))
    if isinstance(expr, Cast):
        return Cast(expr.dtype, map_leaves(expr.arg, leaf))
    return leaf(expr)


def rename_expr(expr: Expr, names: Mapping[str, str]) -> Expr:
    return map_leaves(expr, lambda e: Load(e.access.rename(names)) if isinstance(e, Load) else e)


# ---------------------------------------------------------------------------------------------
# Dimensions, statements, nests, programs


@dataclass(frozen=True)
class Ragged:
    """A data-dependent range ``[start, stop)`` whose bounds are read from a tensor (CSR rows)."""

    start: Affine
    stop: Affine

    def rename(self, names: Mapping[str, str]) -> Ragged:
        return Ragged(self.start.rename(names), self.stop.rename(names))


@dataclass(frozen=True)
class Dim:
    """A loop dimension; ``name`` is its role (p0, p1, ..., r0, ...) once the nest is built."""

    name: str
    extent: int
    kind: DimKind
    ragged: Ragged | None = None

    def __str__(self) -> str:
        if self.ragged:
            rng = f"[{self.ragged.start}, {self.ragged.stop})"
            return f"for {self.name} in {rng}:  # {self.kind.value}, ragged, mean extent {self.extent}"
        return f"for {self.name} in [0, {self.extent}):  # {self.kind.value}"


@dataclass(frozen=True)
class Statement:
    """``write = epilogue(reduce(combiner, body))``, or ``write = body`` without reduction dims."""

    write: Access
    body: Expr
    combiner: Combiner | None = None
    epilogue: Expr | None = None

    def exprs(self) -> tuple[Expr, ...]:
        return (self.body,) if self.epilogue is None else (self.body, self.epilogue)

    def loads(self) -> list[Access]:
        """Every tensor read: loads in body and epilogue, and the indirect index reads inside them."""
        out: list[Access] = []
        for expr in self.exprs():
            for node in walk(expr):
                if isinstance(node, Load):
                    out.append(node.access)
                    out.extend(_indirect_reads(node.access.index))
        out.extend(_indirect_reads(self.write.index))
        return out

    def rename(self, names: Mapping[str, str]) -> Statement:
        return Statement(
            self.write.rename(names),
            rename_expr(self.body, names),
            self.combiner,
            None if self.epilogue is None else rename_expr(self.epilogue, names),
        )


def _indirect_reads(index: Sequence[Affine]) -> list[Access]:
    return [Access(ind.tensor, ind.index) for e in index for ind in e.indirects()]


@dataclass(frozen=True)
class LoopNest:
    """Dims outer -> inner (parallel p_{n-1}..p0, then reduction r_{m-1}..r0) and one statement."""

    op: str
    dims: tuple[Dim, ...]
    statement: Statement

    @property
    def parallel(self) -> tuple[Dim, ...]:
        return tuple(d for d in self.dims if d.kind == DimKind.PARALLEL)

    @property
    def reduction(self) -> tuple[Dim, ...]:
        return tuple(d for d in self.dims if d.kind == DimKind.REDUCTION)

    def dim(self, role: str) -> Dim | None:
        return next((d for d in self.dims if d.name == role), None)

    @property
    def iterations(self) -> int:
        return math.prod(d.extent for d in self.dims)

    @property
    def parallel_iterations(self) -> int:
        return math.prod(d.extent for d in self.parallel)

    def loads(self) -> list[Access]:
        out = self.statement.loads()
        for d in self.dims:
            if d.ragged:
                out.extend(_indirect_reads((d.ragged.start, d.ragged.stop)))
        return out

    def __str__(self) -> str:
        st = self.statement
        lines = [f"# {self.op}"]
        depth = 0
        for d in self.parallel:
            lines.append("  " * depth + str(d))
            depth += 1
        if st.combiner is None:
            lines.append("  " * depth + f"{st.write} = {st.body}")
            return "\n".join(lines)
        lines.append("  " * depth + f"acc = {st.combiner.identity}")
        inner = depth
        for d in self.reduction:
            lines.append("  " * inner + str(d))
            inner += 1
        update = f"acc += {st.body}" if st.combiner == Combiner.SUM else f"acc = {st.combiner.value}(acc, {st.body})"
        lines.append("  " * inner + update)
        lines.append("  " * depth + f"{st.write} = {st.epilogue if st.epilogue is not None else Acc()}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Buffer:
    name: str
    shape: tuple[int, ...]
    dtype: DType
    kind: BufferKind
    value: tuple[float, ...] | None = None  # the elements of a const buffer, row-major

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.kind.value} {self.name}: {self.dtype.value}{list(self.shape)}"


_T = TypeVar("_T")


@dataclass(frozen=True)
class LoopProgram:
    """Buffers and the nests that compute the outputs from the inputs, in execution order."""

    buffers: Mapping[str, Buffer]
    nests: tuple[LoopNest, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    name: str = field(default="")
    #: What planners derive from this program alone, kept with it (the program never changes); see ``memoized``.
    memo: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def memoized(self, key: Any, compute: Callable[[], _T]) -> _T:
        """``compute()``, run once per ``key`` for this program: ``key`` must name everything the value depends on
        besides the program."""
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def __str__(self) -> str:
        head = [f"program {self.name}".rstrip()] + [f"  {b}" for b in self.buffers.values()]
        return "\n".join(head + [str(n) for n in self.nests])


# ---------------------------------------------------------------------------------------------
# Building a nest: roles


def make_nest(op: str, dims: Sequence[Dim], statement: Statement, shapes: Mapping[str, Sequence[int]]) -> LoopNest:
    """Order ``dims`` and rename them by role (p0 = smallest write stride, r0 = smallest load stride).

    ``dims`` carry provisional names used in ``statement``; ``shapes`` maps tensor names to shapes.
    Ties keep the later dimension innermost.
    """
    par = [d for d in dims if d.kind == DimKind.PARALLEL]
    red = [d for d in dims if d.kind == DimKind.REDUCTION]
    write_shape = shapes[statement.write.tensor]

    def write_key(pos_dim: tuple[int, Dim]) -> tuple[float, int]:
        stride = statement.write.stride(pos_dim[1].name, write_shape)
        return (math.inf if not stride else abs(stride), -pos_dim[0])

    loads = statement.loads()

    def load_key(pos_dim: tuple[int, Dim]) -> tuple[float, int]:
        strides = [a.stride(pos_dim[1].name, shapes[a.tensor]) for a in loads]
        finite = [abs(s) for s in strides if s]
        return (min(finite) if finite else math.inf, -pos_dim[0])

    par_sorted = [d for _, d in sorted(enumerate(par), key=write_key)]
    red_sorted = [d for _, d in sorted(enumerate(red), key=load_key)]
    names = {d.name: f"p{i}" for i, d in enumerate(par_sorted)} | {d.name: f"r{i}" for i, d in enumerate(red_sorted)}
    ordered = [*reversed(par_sorted), *reversed(red_sorted)]
    new_dims = tuple(
        Dim(names[d.name], d.extent, d.kind, d.ragged.rename(names) if d.ragged else None) for d in ordered
    )
    return LoopNest(op, new_dims, statement.rename(names))
