"""CUDA for ``reduce(split,S)``: each row of a reduction cut across up to ``S`` blocks, for few, long rows (softmax
or cross-entropy over 8 x 128256 logits, a mean over 10^7 elements) where a block per row leaves most SMs idle.

A *split group* is a group with reductions in row form (``cuda_rows.row_group``), or a whole-tensor reduction
over one dim (one row, no row dims). Its row is cut into parts of whole chunks of ``threads * V`` elements (``V``:
``vectorize``, else :data:`DEFAULT_VECTOR`, halved until it divides the row), at most ``S`` of them and none
empty; a row of one chunk runs as under ``reduce(block)``. Its passes (``cuda_rows.row_passes``: a softmax
max / sum-of-exp or a layernorm mean / variance pair is one pass; other reductions and pointwise members one
each) are cut into launches: a pass that reads a reduction result of the current launch, or a value the current
launch wrote at another position of the row (another block may hold it), starts the next one. Each launch runs
``rows * parts`` blocks of ``threads`` lanes; block ``(row, k_split)`` walks its part with the row emitter
(``RowPlan.split``: vector words, streaming):

- a reduction pass folds its part, and thread 0 writes the part's accumulators (the value; max and sum of exp;
  count, mean and M2) to a scratch buffer, ``partials[component][row][part]``;
- the next launch merges the row's partials first, in every warp: lane i takes parts i, i + 32, ..., then xor
  shuffles, with the combiner, ``k_online`` (rescaled sums) or ``k_welford`` (Chan). Every block merges in the
  same order, so all get the same bits and a run is deterministic (no atomics); its part 0 stores the results
  that leave the group (a later launch that reads them again merges them again, and stores the same values);
- pointwise passes (the softmax normalisation) run over the part.

So softmax and layernorm take two launches (partials; merge and normalise) and read the row twice; a group that
ends with a reduction (a sum, a mean) ends with a launch of one warp per row that merges and stores. Groups
without reductions run as ``transforms.codegen.cuda`` runs them; a group with reductions that is not a split
group, or whose later members read a reduction result at another row, is a ScheduleError. Measured on an H200
(``bench/gpu_transforms.py --sweep``, CUDA-graph replays): softmax 8 x 128256 fp16 in 5.9 us against 15.4 us
for the best block-per-row kernel, layernorm 8 x 65536 5.6 against 11.5, cross-entropy 16 x 128256 10.3 against
17.1 (DRAM bounds: 1.0, 0.6 and 1.9 us).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from embed.loopnest import LoopNest, LoopProgram
from transforms.codegen.cuda import DEFAULT_THREADS, CudaGen
from transforms.codegen.cuda_rows import (
    RowEmitter,
    RowPlan,
    canonical,
    kept_buffers,
    merger,
    one_pass_pairs,
    row_group,
    row_length,
    row_passes,
    row_shaped,
)
from transforms.codegen.expr import literal
from transforms.codegen.kernel import Kernel, compute_dtype, cuda_params
from transforms.codegen.signature import Signature
from transforms.run import Buffer, Launch
from transforms.schedule import FUSE_MODES, Group, Schedule, ScheduleError, plan_groups

SPLITS = (4, 16, 64, 256, 1024)  # S of reduce(split,S)
SMS = 132  # streaming multiprocessors of the H100 / H200 the offered S aim at
MIN_PART = 1024  # elements a part of a row holds at least, for S to be offered
DEFAULT_VECTOR = 4
PARTIALS = "@partials"  # the scratch buffer's key in the kernel signature's names
_COMPONENTS = {"softmax": 2, "welford": 3}


def split_form(g: Group) -> Group | None:
    """Group ``g`` (with reductions) as a split group, or None (see the module docstring)."""
    return row_group(g) if g.depth else g if row_shaped(g) else None


def split_error(g: Group) -> str:
    """Why ``reduce(split)`` cannot run group ``g``; "" when it can, or when ``g`` has no reduction."""
    if not any(m.reduction for m in g.members):
        return ""
    ops = "+".join(m.op for m in g.members)
    rg = split_form(g)
    if rg is None:
        return (f"{ops} is not a row reduction (each member must walk one inner dim of one extent: exactly one "
                "reduction dim, or one parallel dim past the rows, nothing ragged)")
    kept = kept_buffers(rg, False)
    for k, m in enumerate(rg.members):
        t = m.statement.write.tensor
        if m.statement.combiner is not None and t not in kept and any(
                a.tensor == t for r in rg.members[k + 1:] for a in r.loads()):
            return f"{ops}: a later member reads the result {t} of another row"
    return ""


def split_choices(program: LoopProgram) -> tuple[int, ...]:
    """The ``S`` offered for ``program``: none unless every group with reductions is a split group under every
    fuse mode; then each ``S`` that gives some reduction group of the fused program ``SMS / 2`` to ``16 * SMS``
    blocks (about one to sixteen per SM: few rows) with parts of at least :data:`MIN_PART` elements (long rows)."""
    return _offered(_split_shapes(program))


def default_split(program: LoopProgram) -> int | None:
    """The ``S`` a default recipe takes, or None: where the largest reduction group has fewer than ``SMS / 2`` rows
    (a block per row would leave most SMs idle), the smallest offered ``S`` that gives each SM a block (on an
    H200, the fastest S of the three few-long-row cases of ``bench/gpu_transforms.py``)."""
    shapes = _split_shapes(program)
    offered = _offered(shapes)
    rows = max(shapes, key=lambda shape: shape[0] * shape[1], default=(SMS, 0))[0]
    if not offered or rows >= SMS // 2:
        return None
    return next((s for s in offered if rows * s >= SMS), offered[-1])


def _offered(shapes: list[tuple[int, int]]) -> tuple[int, ...]:
    return tuple(s for s in SPLITS if any(SMS // 2 <= rows * s <= 16 * SMS and n >= s * MIN_PART for rows, n in shapes))


def _split_shapes(program: LoopProgram) -> list[tuple[int, int]]:
    """(rows, row length) of each reduction group of the fused program; [] unless every group with reductions
    is a split group under every fuse mode."""
    if any(split_error(g) for mode in FUSE_MODES for g in plan_groups(program, mode)):
        return []
    return [(_rows(rg), row_length(rg)) for g in plan_groups(program, "all")
            if any(m.reduction for m in g.members) and (rg := split_form(g)) is not None]


def generate_split(schedule: Schedule) -> Kernel:
    """The launches running ``schedule`` under ``reduce(split,S)`` (S in ``schedule.split``; see the module doc)."""
    return _SplitGen(schedule).kernel()


def _rows(g: Group) -> int:
    return math.prod(g.row_extent(r) for r in g.rows)


@dataclass(frozen=True)
class SplitPlan:
    """How one split group runs: its row plan (``split`` parts of ``chunks`` chunks), the launch of each pass
    (by its first member's index), the launch count, where each reduction pass's partials start and where the
    group's partials end."""

    plan: RowPlan
    launches: dict[int, int]
    count: int
    offsets: dict[int, int]
    end: int
    rows: int


def plan_split(schedule: Schedule, g: Group, offset: int) -> SplitPlan | None:
    """The split plan of group ``g`` (its partials from ``offset`` on), or None where it runs unsplit."""
    error = split_error(g)
    if error:
        raise ScheduleError(f"reduce(split): {error}; use reduce(block) or reduce(warp)")
    rg = split_form(g) if any(m.reduction for m in g.members) else None
    if rg is None:
        return None
    n, threads = row_length(rg), schedule.threads or DEFAULT_THREADS
    v = schedule.vector or DEFAULT_VECTOR
    while n % v:
        v //= 2
    total = -(-n // (threads * v))
    chunks = -(-total // max(schedule.split, 1))
    parts = -(-total // chunks)
    if parts < 2:
        return None
    plan = RowPlan(rg, n, threads, 1, v, chunks, False, one_pass_pairs(rg.members, n), kept_buffers(rg, False),
                   split=parts)
    launches, count = _launches(plan)
    rows, offsets = _rows(rg), {}
    for k, span in row_passes(plan):
        if span[0].statement.combiner is not None:
            offsets[k] = offset
            offset += _COMPONENTS.get(plan.pairs.get(k, ""), 1) * rows * parts
    return SplitPlan(plan, launches, count, offsets, offset, rows)


def _launches(plan: RowPlan) -> tuple[dict[int, int], int]:
    """The launch of each pass and the launch count (see the module docstring)."""
    depth, out, launch = plan.group.depth, {}, 0
    reduced: set[str] = set()  # results of this launch's reductions
    written: dict[str, tuple[object, ...]] = {}  # row-long values this launch wrote -> where in the row
    for k, span in row_passes(plan):
        if any(a.tensor in reduced or a.tensor in written and (a.fill is not None or canonical(a, m, depth) !=
                                                               written[a.tensor]) for m in span for a in m.loads()):
            launch, reduced, written = launch + 1, set(), {}
        out[k] = launch
        for m in span:
            w = m.statement.write
            if m.statement.combiner is not None:
                reduced.add(w.tensor)
            else:
                written[w.tensor] = canonical(w, m, depth)
    return out, launch + 1 + bool(reduced)


class _SplitGen(CudaGen):
    """``CudaGen`` whose split groups take several launches: all but the last are emitted beside the group's
    own kernel and run before it."""

    def __init__(self, schedule: Schedule) -> None:
        super().__init__(schedule)
        self.plans: dict[tuple[int, ...], SplitPlan] = {}
        size = 0
        for g in schedule.groups:
            split = plan_split(schedule, g, size)
            if split is not None:
                self.plans[g.nests], size = split, split.end
        self.partials = f"b{len(self.sig.args)}"
        if size:
            scratch = Buffer(self.partials, (size,), compute_dtype(schedule.program).value, "scratch")
            self.sig = Signature({**self.sig.names, PARTIALS: self.partials}, (*self.sig.args, scratch),
                                 self.sig.consts)
        self.before: dict[tuple[int, ...], list[tuple[str, list[str], int, int]]] = {}

    def kernel(self) -> Kernel:
        own = super().kernel()
        params = cuda_params(self.sig, self.buffers, self.ctype)
        bodies, launches = [], []
        for g, last in zip(self.s.groups, own.launches, strict=True):
            for entry, lines, grid, block in self.before.get(g.nests, []):
                bodies.append(f'extern "C" __global__ void __launch_bounds__({block}) {entry}({params}) {{\n'
                              + "\n".join(lines) + "\n}")
                launches.append(Launch(entry, self.sig.args, (grid, 1, 1), (block, 1, 1)))
            launches.append(last)
        return Kernel("cuda", own.code + "".join(f"\n{body}\n" for body in bodies), tuple(launches))

    def group(self, g: Group) -> tuple[int, int]:
        split = self.plans.get(g.nests)
        if split is None:
            return super().group(g)
        index = self.s.groups.index(g)
        shape = (0, 0)
        for launch in range(split.count):
            self.lines = []
            shape = self.launch(split, launch)
            if launch < split.count - 1:
                self.before.setdefault(g.nests, []).append((f"tb_kernel{index}_{launch}", self.lines, *shape))
        return shape

    def launch(self, split: SplitPlan, launch: int) -> tuple[int, int]:
        """Emit one launch of a split group into ``lines``; its (grid, block)."""
        plan, g = split.plan, split.plan.group
        merges_only = launch not in split.launches.values()
        if merges_only:  # a warp per row
            plan = replace(plan, lanes=32)
        parts = 1 if merges_only else plan.split
        self.line("const idx_t tid = threadIdx.x;")
        self.line(f"const idx_t row = (idx_t)blockIdx.x / {parts};")
        self.line(f"const int k_split = (int)(blockIdx.x % {parts});")
        self.line("const int lane = (int)tid;")
        self.line(f"const bool valid = row < {split.rows};")
        env, rest = {}, "row"
        for role in reversed(g.rows):
            v, extent = self.var("i"), g.row_extent(role)
            self.line(f"const idx_t {v} = {rest} % {extent};")
            rest, env[role] = f"({rest} / {extent})", v
        self.p.rows = _PartEmitter(plan, self, split=split, launch=launch)
        self.p.rows.emit(env, [d.name for d in g.frame.parallel[: g.depth]])
        self.p.rows = None
        self.lines = [ln for ln in self.lines if ln.strip()]
        return split.rows * parts, plan.lanes


@dataclass
class _PartEmitter(RowEmitter):
    """The row emitter for one launch of a split group: this launch's passes over the block's part of the row,
    after merging the partials of earlier launches' reductions that it needs."""

    split: SplitPlan | None = None
    launch: int = 0
    current: int = 0  # the pass being emitted

    def passes(self) -> list[tuple[int, tuple[LoopNest, ...]]]:
        assert self.split is not None
        at, passes = self.split.launches, super().passes()
        now = {a.tensor for k, span in passes if at[k] == self.launch for m in span for a in m.loads()}
        return [(k, span) for k, span in passes if at[k] == self.launch or at[k] < self.launch and
                k in self.split.offsets and (at[k] == self.launch - 1 or any(m.statement.write.tensor in now
                                                                             for m in span))]

    def run(self, k: int, span: tuple[LoopNest, ...], env: dict[str, str]) -> set[str]:
        assert self.split is not None
        self.current = k
        if self.split.launches[k] == self.launch:
            return super().run(k, span, env)
        kind, t = self.plan.pairs.get(k, ""), self.ctype
        combiner = span[0].statement.combiner
        assert combiner is not None
        idents = {"softmax": [-math.inf, 0.0], "welford": [0.0, 0.0, 0.0]}.get(kind, [combiner.identity])
        accs, ys, i = [self.var("a") for _ in idents], [self.var("y") for _ in idents], self.var("p")
        merge = merger(kind, span[0])
        self.line(f"{t} " + ", ".join(f"{a} = {literal(x, t)}" for a, x in zip(accs, idents, strict=True)) + ";")
        loads = " ".join(f"const {t} {y} = {self.partial(c)}{i}];" for c, y in enumerate(ys))
        parts = self.plan.split
        self.line(f"for (int {i} = (int)(tid % 32); {i} < {parts}; {i} += 32) {{ {loads} {merge(accs, ys)} }}")
        self.shuffle(accs, merge, 32)
        super().reduced(span, env, accs)
        return set()

    def reduced(self, span: tuple[LoopNest, ...], env: dict[str, str], accs: list[str]) -> None:
        """This launch's reduction: the part's accumulators go to the partials."""
        stores = " ".join(f"{self.partial(c)}k_split] = {a};" for c, a in enumerate(accs))
        self.line(f"if (tid == 0) {{ {stores} }}")

    def partial(self, component: int) -> str:
        """The start of ``partials[...][row][`` for this pass's ``component`` (an index into it follows)."""
        assert self.split is not None
        parts = self.plan.split
        start = self.split.offsets[self.current] + component * self.split.rows * parts
        return f"{self.gen.partials}[{start} + row * {parts} + "  # type: ignore[attr-defined]
