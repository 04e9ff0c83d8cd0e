"""The scheduled loop program a recipe produces: how nests are grouped and how each group's loops are laid out.

A ``Schedule`` is a ``LoopProgram`` plus knobs set by the recipe's steps (``transforms.steps``). Nests are
cut into *groups* (``fuse``); a group runs its nests one after another inside shared outer loops over the
group's *row dims*: the outermost ``depth`` parallel dims of its last nest (its *frame*), matched by
position and extent with the outermost parallel dims of every member. A group is legal when every value a
member reads from an earlier member was written in the same row (checked on the index expressions), so
the row loops may run in parallel. Roles in recipe steps (``tile(p1,4)``) name the frame's dims.

Knobs (their meaning per backend is the code generator's): ``parallel`` row loops to collapse into one
parallel loop, ``tiles`` of row dims (cpu: strip-mined, register-blocked in reductions; cuda: rows per
thread), ``order`` of the row dims, ``vector`` width and ``unroll`` factor of innermost loops, ``reduce``
strategy with its ``lanes`` (or, under ``reduce(split,S)``, its ``split``), the cuda launch shape ``threads`` /
``rows_per_block``, (cuda) ``row_depth``:
when set, a one-nest group keeps only its outer ``row_depth`` row dims and strides the rest across lanes, and
(cuda) ``row_mode``: when set, row groups run as row kernels (``transforms.codegen.cuda_rows``), and (cuda)
``stage``: (tile, elements per thread), when set, strided pointwise nests go through shared-memory tiles
(``transforms.codegen.cuda_stage``), (cuda) ``chunk``: the nonzeros per chunk of ``sparse(merge,C,V)``, and (cuda)
``persist``: blocks per multiprocessor of a persistent row kernel, 0: one block per row group (``steps.persist``),
and (cuda) ``stream``: streaming cache hints on row kernels' once-touched data (``steps.cache_hint``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

from embed.loopnest import Access, Affine, BufferKind, LoopNest, LoopProgram
from transforms.contraction import GemmConfig
from transforms.recipe import Role

FUSE_MODES = ("none", "outer", "all")


class ScheduleError(ValueError):
    """A recipe step cannot be applied to this program (unknown step, bad parameter)."""


@dataclass(frozen=True)
class Group:
    """Consecutive nests (indices into the program) run inside ``depth`` shared row loops."""

    nests: tuple[int, ...]
    depth: int
    program: LoopProgram = field(repr=False, compare=False)

    @property
    def members(self) -> tuple[LoopNest, ...]:
        return tuple(self.program.nests[i] for i in self.nests)

    @property
    def frame(self) -> LoopNest:
        return self.program.nests[self.nests[-1]]

    @property
    def rows(self) -> tuple[str, ...]:
        """Role names of the row dims, outer -> inner."""
        return tuple(d.name for d in self.frame.parallel[: self.depth])

    def row_extent(self, role: str) -> int:
        return next(d.extent for d in self.frame.parallel if d.name == role)


@dataclass(frozen=True)
class Schedule:
    """A program with its knobs; ``groups`` derives the grouping from ``fuse``."""

    program: LoopProgram
    fuse: str = "none"
    parallel: int = 0
    tiles: tuple[tuple[Role, int], ...] = ()
    order: tuple[Role, ...] = ()
    vector: int = 0
    unroll: int = 1
    reduce: str = "serial"
    lanes: int = 1
    split: int = 0  # (cuda) blocks sharing each row under reduce(split,S): S (transforms.codegen.cuda_split)
    threads: int = 0
    rows_per_block: int = 1
    row_depth: int = 0
    row_mode: str = ""
    gemm: GemmConfig | None = None  # (cuda) a contraction run by transforms.codegen.cuda_gemm
    sparse: tuple[str, int] = ("csr", 1)  # (format, width) of ragged reductions: transforms.steps.sparse
    chunk: int = 0  # (cuda) nonzeros per chunk under sparse(merge,C,V): transforms.codegen.cuda_spmm
    stage: tuple[int, int] = (0, 0)  # (cuda) (tile, elements per thread) of staged nests; 0: off (steps.stage)
    persist: int = 0  # (cuda) blocks per SM of a persistent row kernel; 0: off (steps.persist)
    stream: bool = False  # (cuda) evict-first loads / stores of row kernels' once-touched data (steps.cache_hint)
    vendor: tuple[str, ...] = ()  # a vendor library call then the generated epilogue: ("conv", "cudnn", "benchmark"),
    # ("conv", "torch"), ("gemm", "blas"); transforms.codegen.vendor (steps.conv, steps.gemm)

    def set(self, **knobs: object) -> Schedule:
        return replace(self, **knobs)  # type: ignore[arg-type]

    def tile(self, role: str) -> int:
        return next((t for r, t in self.tiles if str(r) == role), 1)

    @cached_property
    def groups(self) -> tuple[Group, ...]:
        return plan_groups(self.program, self.fuse)

    def row_order(self, group: Group) -> tuple[str, ...]:
        """The group's row roles outer -> inner: ``order`` when it permutes exactly those roles."""
        wanted = tuple(str(r) for r in self.order)
        return wanted if sorted(wanted) == sorted(group.rows) and len(group.rows) > 1 else group.rows


# ---------------------------------------------------------------------------------------------
# Grouping


def plan_groups(program: LoopProgram, mode: str) -> tuple[Group, ...]:
    """Greedy grouping of consecutive nests: ``none`` keeps each nest alone (depth = its parallel dims),
    ``outer`` fuses at depth 1 where legal, ``all`` at the deepest legal depth."""
    if mode not in FUSE_MODES:
        raise ScheduleError(f"unknown fuse mode {mode!r}; choose one of: {', '.join(FUSE_MODES)}")
    return program.memoized(("plan_groups", mode), lambda: _plan_groups(program, mode))


def _plan_groups(program: LoopProgram, mode: str) -> tuple[Group, ...]:
    nests = program.nests
    writers: dict[str, list[int]] = {}
    for i, n in enumerate(nests):
        writers.setdefault(n.statement.write.tensor, []).append(i)
    groups: list[Group] = []
    current: list[int] = []
    depth = 0
    for i, nest in enumerate(nests):
        if current and mode != "none":
            limit = 1 if mode == "outer" else min(depth, len(nest.parallel))
            d = next((d for d in range(limit, 0, -1) if _fusable(program, writers, [*current, i], d)), 0)
            if d:
                current.append(i)
                depth = d
                continue
        if current:
            groups.append(Group(tuple(current), depth, program))
        current, depth = [i], len(nest.parallel)
    if current:
        groups.append(Group(tuple(current), depth, program))
    return tuple(groups)


def _fusable(program: LoopProgram, writers: dict[str, list[int]], members: list[int], depth: int) -> bool:
    nests = [program.nests[i] for i in members]
    frame = [d.extent for d in nests[-1].parallel[:depth]]
    if any(len(n.parallel) < depth or [d.extent for d in n.parallel[:depth]] != frame for n in nests):
        return False
    if any(d.ragged is not None for n in nests for d in n.parallel[:depth]):
        return False
    written = {program.nests[i].statement.write.tensor: i for i in members}
    for j in members:
        reader = program.nests[j]
        for access in reader.loads():
            i = written.get(access.tensor)
            if i is None or i == j:
                continue
            if len(writers[access.tensor]) > 1 or i > j:
                return False
            writer = program.nests[i]
            if not _same_row(writer.statement.write, _rows(writer, depth), access, _rows(reader, depth)):
                return False
    return True


def _rows(nest: LoopNest, depth: int) -> dict[str, str]:
    return {d.name: f"@row{k}" for k, d in enumerate(nest.parallel[:depth])}


def _same_row(write: Access, wrows: dict[str, str], read: Access, rrows: dict[str, str]) -> bool:
    """Whether the element ``read`` reads in a row was written by ``write`` in the same row."""
    if len(write.index) != len(read.index) or read.fill is not None:
        return False
    covered: set[str] = set()
    for w, r in zip(write.index, read.index, strict=True):
        w_rows, r_rows = w.dims() & wrows.keys(), r.dims() & rrows.keys()
        if w_rows:
            if _atoms_only(w, wrows) is False or w.rename(wrows) != r.rename(rrows):
                return False
            covered |= w_rows
        elif r_rows:
            return False
    return covered == set(wrows)


def _atoms_only(expr: Affine, rows: dict[str, str]) -> bool:
    """Whether ``expr`` is a plain affine function of row dims (no div, mod or indirect atoms)."""
    return all(isinstance(a, str) and a in rows for a, _ in expr.terms)


def temporaries(program: LoopProgram) -> list[str]:
    """Names of the program's temp buffers, in buffer order (they become scratch arguments)."""
    return [name for name, b in program.buffers.items() if b.kind == BufferKind.TEMP]
