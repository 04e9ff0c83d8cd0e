"""Row kernels for the cuda generator (``row_mode`` step): memory-bound row groups at one read per byte.

A group qualifies when every member walks one *inner* dim of the same extent ``N`` per row: a reduction
member over exactly one reduction dim (softmax max / sum, layernorm mean / var), or a pointwise member with
exactly one parallel dim past the rows (normalize, bias, activation). An all-pointwise group gives up its
innermost row dim for this. Each row gets ``L`` lanes; a lane owns ``V`` consecutive elements per chunk of
``L * V``, so every inner-dim access is a run of ``V`` elements, read or written as one 16-byte (or narrower)
word when contiguous and aligned (checked on the index expressions; scalar accesses otherwise). A ``vectorize``
wider than a word runs as more chunks of one word (``_word_elements``).

Modes: ``registers`` unrolls the chunks and keeps every value it loads or computes per lane in registers,
so each member reuses what earlier members read (each input byte is read once), values a reduction computed
per element (``exp(x - max)``) are reused by later members, and temporaries that never leave the group are
never stored; when a lane would hold more than :data:`MAX_REGISTER_ELEMS` elements it falls back to ``shared``
(itself ``online`` past the shared-memory limit); with ``reduce(block)`` and ``rows_per_block(1)`` it takes the
fewest lanes (at least 4) that hold the row at 16 elements a lane, for rows a warp can hold that way, else at
:data:`MAX_REGISTER_ELEMS` (measured on an H200: 8 lanes beat 4 on 128 halves; 1024 lanes holding a 32000-wide
row lose to 256 streaming online); ``rows_per_block(R > 1)`` gives each row ``threads / R`` lanes.
``online`` streams the row per member, but two reductions that one pass can do run as one: a max followed by a
sum of ``exp(x - max)`` over the same values (rescaling the sum), and a mean followed by a sum of squared
deviations from it (Welford / Chan merges of per-chunk (count, mean, M2)). ``stream`` streams every member.
``shared`` runs like ``online`` but the first pass over an input that later passes read again also copies its
words into dynamic shared memory, where each lane re-reads its own words (no barrier needed): the input leaves
device memory once. It falls back to ``online`` when the copies would exceed :data:`MAX_SHARED_BYTES` a block.
Per-row scalars (reduction results) live in registers in every mode; lanes combine with sub-warp or warp
shuffles and, for ``L > 32``, the warps' results again with shuffles through shared memory. A division by a
per-row value is a multiplication by its reciprocal. ``cuda_split`` runs the same emitter over parts of rows
(``RowPlan.split`` blocks a row, through the ``passes`` / ``run`` / ``reduced`` hooks).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from embed.ir import DType
from embed.loopnest import (
    Acc,
    Access,
    Affine,
    Buffer,
    BufferKind,
    Call,
    Combiner,
    Const,
    Expr,
    Load,
    LoopNest,
    LoopProgram,
    walk,
    without_splits,
)
from transforms.codegen.expr import Env, Printer, combine, extents, literal
from transforms.schedule import Group, Schedule, plan_groups

MODES = ("registers", "online", "stream", "shared")
MAX_REGISTER_ELEMS = 32
MAX_SHARED_BYTES = 227 * 1024  # dynamic shared memory one block may use on sm_90 (the runner raises the limit)
_VECTOR_DTYPES = {DType.FLOAT32: 4, DType.FLOAT16: 2, DType.BFLOAT16: 2}
_PIECES = {16: ("uint4", "xyzw"), 8: ("uint2", "xy"), 4: ("unsigned int", "")}
INNER = "@inner"
_NAMED = re.compile(r"[A-Za-z_]\w*(\[\d+\])?")


@dataclass
class RowPlan:
    """How one group runs as a row kernel."""

    group: Group
    n: int  # inner extent
    lanes: int
    per_block: int
    vector: int
    chunks: int
    registers: bool
    pairs: dict[int, str]  # member k starts a one-pass pair ("softmax" | "welford") with member k + 1
    kept: frozenset[str]  # buffers whose values stay in registers inside the group
    staged: dict[str, int] = field(default_factory=dict)  # shared mode: input -> byte offset of its copies
    split: int = 1  # blocks sharing each row (``cuda_split``): block ``k_split`` walks its own ``chunks`` chunks
    persist: int = 0  # blocks per SM of a persistent grid looping over the rows (``persist``); 0: a block per rows
    stream: bool = False  # evict-first loads and stores of buffers larger than a row (``cache_hint``)

    def streamed(self, buffer: Buffer) -> bool:
        """Whether ``buffer``'s words travel with streaming cache hints: data larger than one row."""
        return self.stream and buffer.numel > self.n

    @property
    def threads(self) -> int:
        return self.lanes * self.per_block

    def row_bytes(self, dtype: DType) -> int:
        """Shared-memory bytes one row's copy of a staged input of ``dtype`` takes."""
        return self.chunks * self.lanes * self.vector * _VECTOR_DTYPES[dtype]

    @property
    def shared_bytes(self) -> int:
        return sum(self.per_block * self.row_bytes(self.group.program.buffers[t].dtype) for t in self.staged)


def row_group(g: Group) -> Group | None:
    """``g`` in row form (one inner dim per member, equal extents), or None when it does not qualify."""
    members = g.members
    if all(m.statement.combiner is None for m in members) and g.depth >= 2 and \
            all(len(m.parallel) == g.depth for m in members):
        g = Group(g.nests, g.depth - 1, g.program)
    return g if g.depth > 0 and row_shaped(g) else None


def has_row_groups(program: LoopProgram) -> bool:
    """Whether some group of ``program`` fused whole runs as a row kernel: where the row steps apply."""
    return any(row_group(g) for g in plan_groups(program, "all"))


def row_shaped(g: Group) -> bool:
    """Whether every member of ``g`` walks one inner dim past the group's rows, all of one extent: a reduction
    member exactly one reduction dim, a pointwise member exactly one more parallel dim (nothing ragged)."""
    sizes = set()
    for m in g.members:
        if any(d.ragged is not None for d in m.dims):
            return False
        if m.statement.combiner is not None:
            if len(m.parallel) != g.depth or len(m.reduction) != 1:
                return False
        elif m.reduction or len(m.parallel) != g.depth + 1:
            return False
        sizes.add(_inner(m, g.depth))
    return len(sizes) == 1


def row_length(g: Group) -> int:
    """The inner extent of a group in row form (see :func:`row_group`)."""
    return _inner(g.members[0], g.depth)


def _inner(m: LoopNest, depth: int) -> int:
    return (m.reduction[0] if m.statement.combiner is not None else m.parallel[depth]).extent


def inner_name(m: LoopNest, depth: int) -> str:
    return (m.reduction[0] if m.statement.combiner is not None else m.parallel[depth]).name


def plan_rows(schedule: Schedule, g: Group, default_threads: int) -> RowPlan | None:
    """The row plan of group ``g`` under ``schedule``'s knobs, or None (the generic path then runs it)."""
    if schedule.row_mode not in MODES:
        return None
    rg = row_group(g)
    if rg is None:
        return None
    n = _inner(rg.members[0], rg.depth)
    v = max(schedule.vector, 1)
    while n % v:
        v //= 2
    threads = schedule.threads or default_threads
    vectors = -(-n // v)
    reduces = any(m.statement.combiner is not None for m in rg.members)
    if not reduces:  # whole warps: a power of two up to 32, else a multiple of 32
        lanes = min(threads, vectors)
        lanes = 1 << (lanes - 1).bit_length() if lanes <= 32 else -(-lanes // 32) * 32
    elif schedule.row_mode == "registers" and schedule.reduce not in ("thread", "warp", "lanes"):
        # block mode holding rows, one row per block asked: the fewest lanes (at least 4) that hold the row, when
        # the block's lanes can (more rows per SM, more loads in flight); else the block's lanes
        fit = max(_fit(n, MAX_REGISTER_ELEMS), min(_fit(n, MAX_REGISTER_ELEMS // 2), 32))
        lanes = max(32, threads // max(schedule.rows_per_block, 1) // 32 * 32)
        lanes = min(fit if fit <= lanes and schedule.rows_per_block <= 1 else lanes, 1 << (vectors - 1).bit_length())
    else:
        mode = schedule.reduce
        lanes = {"thread": 1, "warp": 32, "lanes": schedule.lanes}.get(
            mode, max(32, threads // max(schedule.rows_per_block, 1) // 32 * 32))
        lanes = min(lanes, 1 << (vectors - 1).bit_length())
    per_block = max(1, threads // lanes)
    v = min(v, _word_elements(rg, n))  # wider runs as more chunks: a warp's word loads stay one contiguous span
    chunks = -(-n // (lanes * v))
    registers = schedule.row_mode == "registers" and chunks * v <= MAX_REGISTER_ELEMS
    pairs = {} if registers or schedule.row_mode == "stream" else one_pass_pairs(rg.members, n)
    plan = RowPlan(rg, n, lanes, per_block, v, chunks, registers, pairs, kept_buffers(rg, registers),
                   persist=schedule.persist, stream=schedule.stream)
    if schedule.row_mode in ("registers", "shared") and not registers:
        plan.staged = _staged(plan)
    return plan


def _word_elements(g: Group, n: int) -> int:
    """The most consecutive elements a lane may own per chunk: what one 16-byte word holds of the widest vectorized
    dtype among the group's tensors larger than a row (its traffic; a row-long weight stays in the L1 cache). A lane
    owning more (``vectorize(8)`` on float32: two words) would make each of its word loads and stores a warp
    instruction over every other 16 bytes, half of each sector; as more chunks of one word a lane the warp's words
    are contiguous. On an H200 a float32 ``add+layer_norm+silu`` of 4096 x 1024 took 24-25 us in the two-word
    layout and 16 us with one word a lane (``bench/README.md``)."""
    buffers = [g.program.buffers[a.tensor] for m in g.members for a in (m.statement.write, *m.loads())]
    sizes = [_VECTOR_DTYPES[b.dtype] for b in buffers if b.dtype in _VECTOR_DTYPES and b.numel > n]
    return 16 // max(sizes, default=4)


def persistent_grid(plan: RowPlan, blocks: int) -> int:
    """The blocks of a persistent launch (``plan.persist`` per SM of an H100 / H200), at most ``blocks``."""
    from transforms.codegen.cuda_split import SMS  # cuda_split imports this module

    return min(blocks, plan.persist * SMS)


def _fit(n: int, per_lane: int) -> int:
    """The fewest lanes, a power of two and at least 4, that hold ``n`` elements at ``per_lane`` each."""
    return max(4, 1 << (-(-n // per_lane) - 1).bit_length())


def one_pass_pairs(members: tuple[LoopNest, ...], n: int) -> dict[int, str]:
    """Members k that start a one-pass pair with k + 1 over the same x: "softmax" when k is ``m = max(x)`` and
    k + 1 ``sum(exp(x - m))``; "welford" when k is ``m = sum(x) / n`` and k + 1 ``sum((x - m) * (x - m))``."""
    out: dict[int, str] = {}
    for k in range(len(members) - 1):
        a, b = members[k].statement, members[k + 1].statement
        if k - 1 in out or members[k].dims != members[k + 1].dims or b.combiner != Combiner.SUM:
            continue
        deviation = Call("sub", (a.body, Load(a.write)))
        if a.combiner == Combiner.MAX and a.epilogue is None and b.body == Call("exp", (deviation,)):
            out[k] = "softmax"
        elif a.combiner == Combiner.SUM and a.epilogue == Call("div", (Acc(), Const(float(n)))) and \
                b.body == Call("mul", (deviation, deviation)):
            out[k] = "welford"
    return out


def row_passes(plan: RowPlan) -> list[tuple[int, tuple[LoopNest, ...]]]:
    """The group's members as the passes over the row that the plan makes (a pair is one pass), each with the
    index of its first member."""
    members, out, k = plan.group.members, [], 0
    while k < len(members):
        span = 2 if k in plan.pairs else 1
        out.append((k, members[k: k + span]))
        k += span
    return out


def merger(kind: str, first: LoopNest) -> Callable[[list[str], list[str]], str]:
    """The statement folding accumulators ``b`` into ``a`` for a pass of ``kind``: "softmax" (max, sum of exp),
    "welford" (count, mean, M2), or "" (one reduction, ``first``, by its combiner)."""
    if kind == "softmax":
        return lambda a, b: f"k_online({a[0]}, {a[1]}, {b[0]}, {b[1]});"
    if kind == "welford":
        return lambda a, b: f"k_welford({a[0]}, {a[1]}, {a[2]}, {b[0]}, {b[1]}, {b[2]});"
    combiner = first.statement.combiner
    assert combiner is not None
    return lambda a, b: combine(combiner.value, a[0], b[0])


def _staged(plan: RowPlan) -> dict[str, int]:
    """Shared mode: byte offsets of the inputs worth copying to shared memory (read by two passes or more, in
    the same row-dependent, vectorizable way), or {} when those copies would not fit."""
    g, depth = plan.group, plan.group.depth
    written = {m.statement.write.tensor for m in g.members}
    reads: dict[str, set[tuple[Affine, ...]]] = {}
    passes: dict[str, int] = {}
    for _, span in row_passes(plan):
        seen = set()
        for m in span:
            inner = inner_name(m, depth)
            for a in m.loads():
                rows = {d.name for d in m.parallel[:depth]}
                if inner in a.dims() and a.dims() & rows and a.tensor not in written:
                    buf = g.program.buffers[a.tensor]
                    ok = a.fill is None and vectorizable(a, buf.shape, buf.dtype, inner, plan.vector)
                    reads.setdefault(a.tensor, set()).add(canonical(a, m, depth) if ok else ())
                    seen.add(a.tensor)
        for t in seen:
            passes[t] = passes.get(t, 0) + 1
    chosen = [t for t, count in passes.items() if count > 1 and len(reads[t]) == 1 and () not in reads[t]]
    offsets, total = {}, 0
    for t in chosen:
        offsets[t] = total
        total += plan.per_block * plan.row_bytes(g.program.buffers[t].dtype)
    return offsets if total <= MAX_SHARED_BYTES else {}


def kept_buffers(g: Group, registers: bool) -> frozenset[str]:
    """Buffers written in the group whose every in-group read hits the written element of the same lane:
    per-row scalars always, row-long values in ``registers`` mode."""
    program = g.program
    kept = set()
    for k, m in enumerate(g.members):
        write = m.statement.write
        if len([n for n in program.nests if n.statement.write.tensor == write.tensor]) != 1:
            continue
        scalar = m.statement.combiner is not None
        if not scalar and not registers:
            continue
        target = canonical(write, m, g.depth)
        reads = [(a, r) for r in g.members[k + 1:] for a in r.loads() if a.tensor == write.tensor]
        if reads and all(a.fill is None and canonical(a, r, g.depth) == target for a, r in reads):
            kept.add(write.tensor)
    return frozenset(kept)


def canonical(access: Access, m: LoopNest, depth: int) -> tuple[Affine, ...]:
    names = {d.name: f"@row{k}" for k, d in enumerate(m.parallel[:depth])} | {inner_name(m, depth): INNER}
    return access.rename(names).index


def _local(g: Group, tensor: str) -> bool:
    """Whether ``tensor`` is a temporary that no nest outside the group reads."""
    if g.program.buffers[tensor].kind != BufferKind.TEMP:
        return False
    inside = set(g.nests)
    return not any(a.tensor == tensor for i, n in enumerate(g.program.nests) if i not in inside for a in n.loads())


def vectorizable(access: Access, shape: tuple[int, ...], dtype: DType, dim: str, width: int) -> bool:
    """Whether ``width`` consecutive values of ``dim`` (starting at a multiple of ``width``) are one aligned,
    contiguous run of ``access``'s tensor that 4-, 8- or 16-byte words can carry."""
    size = _VECTOR_DTYPES.get(dtype)
    if size is None or access.fill is not None or width * size < 4 or width < 2:
        return False
    offset = without_splits(access.offset(shape))  # a merged row's digits cancel: ``W * (q // W) + q % W`` is q
    if offset.const % width:
        return False
    unit = False
    for atom, coef in offset.terms:
        if atom == dim:
            unit = coef == 1
        elif dim in Affine.of(atom).dims() or coef % width:
            return False
    return unit


@dataclass
class RowEmitter:
    """Emits one row kernel's body through the generator's ``line`` / ``var`` and printer (see module doc)."""

    plan: RowPlan
    gen: object  # transforms.codegen.cuda.CudaGen (kept untyped: the two modules call each other)
    p: Printer = field(init=False)
    scopes: list[dict[tuple[str, str], str]] = field(default_factory=lambda: [{}])
    pending: list[str] = field(default_factory=list)
    slot: int = 0
    kc: str = ""
    guard: str = ""
    inner: str = ""
    fetching: set[str] = field(default_factory=set)  # staged inputs this pass copies to shared memory
    fetched: set[str] = field(default_factory=set)  # staged inputs already in shared memory
    ready: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # prefetched load -> its words

    def __post_init__(self) -> None:
        self.p = self.gen.p  # type: ignore[attr-defined]
        self.ctype: str = self.gen.ctype  # type: ignore[attr-defined]
        self.buffers = self.gen.buffers  # type: ignore[attr-defined]

    def line(self, text: str) -> None:
        self.gen.line(text)  # type: ignore[attr-defined]

    def var(self, prefix: str) -> str:
        return self.gen.var(prefix)  # type: ignore[attr-defined,no-any-return]

    # -- the body ------------------------------------------------------------------------------

    def emit(self, env: dict[str, str], frame: list[str]) -> None:
        self.declare()
        self.body(env, frame)

    def declare(self) -> None:
        """Shared arrays and (registers mode) the lane's chunk offsets."""
        plan = self.plan
        if plan.lanes > 32:
            self.line(f"__shared__ {self.ctype} k_part[{3 * plan.threads // 32}];")
        if plan.staged:
            self.line("extern __shared__ __align__(16) unsigned char k_smem[];")
        if plan.registers:
            for c in range(plan.chunks):
                self.line(f"const idx_t kc{c} = {c * plan.lanes * plan.vector} + (idx_t)lane * {plan.vector};")

    def persistent(self, rows: int, decode: Callable[[str, str], dict[str, str]], frame: list[str]) -> None:
        """The kernel as a loop of each row group over rows ``blockIdx.x * R + tid / L`` plus multiples of the
        grid's stride (``persist``). In registers mode the next row's input words are loaded before the current
        row is reduced and written. ``decode(row, valid)`` emits a row's indices and returns them as an env."""
        plan, r = self.plan, self.plan.per_block
        self.declare()
        self.line(f"const idx_t k_stride = (idx_t)gridDim.x * {r};")
        self.line(f"idx_t k_next = (idx_t)blockIdx.x * {r} + tid / {plan.lanes};")
        pieces = self.prefetch(decode("k_next", f"k_next < {rows}"), f"k_next < {rows}", frame, declare=True)
        self.line(f"for (idx_t k_base = (idx_t)blockIdx.x * {r}; k_base < {rows}; k_base += k_stride) {{")
        self.line("const idx_t row = k_next;")
        self.line(f"const bool valid = row < {rows};")
        env = decode("row", "valid")
        if pieces:
            self.line(" ".join(f"const {ctype} {name}c = {name};" for name, ctype in pieces))
            self.ready = {key: [f"{name}c{word}" for name, word in words] for key, words in self.words(env, frame)}
        self.line("k_next = row + k_stride;")
        if pieces:
            self.prefetch(decode("k_next", f"k_next < {rows}"), f"k_next < {rows}", frame)
        self.body(env, frame)
        self.line("}")

    def prefetch(self, env: dict[str, str], valid: str, frame: list[str], declare: bool = False) \
            -> list[tuple[str, str]]:
        """Registers mode: load the words of every input the group reads along its rows, at ``env``'s row, into
        registers ``kf*`` (declared first if ``declare``); their (name, type)."""
        if not self.plan.registers:
            return []
        pieces, loads = [], []
        for k, ((tensor, _), (ptr, nwords, inside)) in enumerate(self.row_inputs(env, frame).items()):
            ctype, _, per = _piece(nwords)
            words = []
            for i in range(nwords // per):
                pieces.append((f"kf{k}_{i}", ctype))
                address = f"(const {ctype}*)((const char*)({ptr}) + {4 * per * i})"
                words.append(f"kf{k}_{i} = {_read(address, self.plan.streamed(self.buffers[tensor]))};")
            loads.append((" && ".join(c for c in (valid, inside) if c), " ".join(words)))
        if declare and pieces:
            self.line(" ".join(f"{ctype} {name}{{}};" for name, ctype in pieces))
        for cond, words in loads:
            self.line(f"if ({cond}) {{ {words} }}")
        return pieces

    def words(self, env: dict[str, str], frame: list[str]) -> list[tuple[tuple[str, str], list[tuple[str, str]]]]:
        """``load``'s key at ``env``'s row of each prefetched input and chunk, with its words as (register, field)
        pairs (the fields ``.x``... of the registers :meth:`prefetch` names)."""
        out = []
        for k, (key, (_, nwords, _)) in enumerate(self.row_inputs(env, frame).items()):
            _, fields, per = _piece(nwords)
            out.append((key, [(f"kf{k}_{i}", f".{f}" if f else "") for i in range(nwords // per)
                              for f in list(fields) or [""]]))
        return out

    def row_inputs(self, env: dict[str, str], frame: list[str]) -> dict[tuple[str, str], tuple[str, int, str]]:
        """Vector loads of inputs along the rows, per chunk: ``load``'s key at ``env``'s row -> (address, 32-bit
        words, the chunk's guard: "" unless it runs past the row's end)."""
        plan, g = self.plan, self.plan.group
        written = {m.statement.write.tensor for m in g.members}
        step = plan.lanes * plan.vector
        out: dict[tuple[str, str], tuple[str, int, str]] = {}
        for m in g.members:
            inner, ext = inner_name(m, g.depth), extents(m)
            own = {d.name: env[frame[i]] for i, d in enumerate(m.parallel[: g.depth])}
            for a in m.loads():
                buf = self.buffers[a.tensor]
                if a.tensor in written or not a.dims() & own.keys() or a.fill is not None or \
                        not vectorizable(a, buf.shape, buf.dtype, inner, plan.vector):
                    continue
                for c in range(plan.chunks):
                    offset = self.p.offset(a.tensor, a.index, {**own, inner: f"kc{c}"}, ext)
                    out.setdefault((a.tensor, offset), (f"{self.p.names[a.tensor]} + {offset}",
                                                        plan.vector * _VECTOR_DTYPES[buf.dtype] // 4,
                                                        "" if (c + 1) * step <= plan.n else f"kc{c} < {plan.n}"))
        return out

    def body(self, env: dict[str, str], frame: list[str]) -> None:
        """The passes over one row (indices in ``env``)."""
        plan, g = self.plan, self.plan.group
        written: set[str] = set()
        for k, span in self.passes():
            if {a.tensor for m in span for a in m.loads()} & written:
                self.line("__syncthreads();" if plan.lanes > 32 else "__syncwarp();" if plan.lanes > 1 else "")
                written.clear()
            nest = span[0]
            own = {d.name: env[frame[i]] for i, d in enumerate(nest.parallel[: g.depth])}
            self.inner = inner_name(nest, g.depth)
            written |= self.run(k, span, own)
            self.fetched |= self.fetching

    def passes(self) -> list[tuple[int, tuple[LoopNest, ...]]]:
        """The passes this kernel makes (see :func:`row_passes`)."""
        return row_passes(self.plan)

    def run(self, k: int, span: tuple[LoopNest, ...], env: dict[str, str]) -> set[str]:
        """Emit pass ``k`` (members ``span``); returns what it writes that later passes read back from memory."""
        nest = span[0]
        if len(span) == 2:
            (self.online if self.plan.pairs[k] == "softmax" else self.welford)(*span, env)
            return self.result_written(span[0]) | self.result_written(span[1])
        if nest.statement.combiner is not None:
            self.reduction(nest, env)
            return self.result_written(nest)
        self.pointwise(nest, env)
        return self.result_written(nest)

    def result_written(self, nest: LoopNest) -> set[str]:
        t = nest.statement.write.tensor
        return set() if t in self.plan.kept else {t}

    def chunks(self, body: object) -> None:
        """Run ``body()`` once per chunk with ``self.kc`` / ``self.guard`` set (unrolled in registers mode)."""
        plan = self.plan
        step = plan.lanes * plan.vector
        if plan.registers:
            for c in range(plan.chunks):
                self.kc = f"kc{c}"
                self.guard = "" if (c + 1) * step <= plan.n else f"kc{c} < {plan.n}"
                body()  # type: ignore[operator]
            self.guard = ""
            return
        c = self.var("c")
        self.kc = self.var("kc")
        if self.gen.s.unroll > 1:  # type: ignore[attr-defined]
            self.line(f"#pragma unroll {self.gen.s.unroll}")  # type: ignore[attr-defined]
        first = f"(idx_t)k_split * {plan.chunks * step} + " if plan.split > 1 else ""
        tail = plan.split * plan.chunks * step > plan.n  # some chunk runs past the row's end
        self.line(f"for (int {c} = 0; {c} < {plan.chunks}; {c}++) {{")
        self.line(f"  const idx_t {self.kc} = {first}(idx_t){c} * {step} + (idx_t)lane * {plan.vector};")
        if tail:
            self.line(f"  if ({self.kc} < {plan.n}) {{")
        self.scopes.append({})
        body()  # type: ignore[operator]
        self.scopes.pop()
        self.line("}}" if tail else "}")

    def values(self, expr: object, env: dict[str, str], ext: dict[str, int], acc: str | None = None) -> list[str]:
        """The ``V`` per-slot texts of ``expr`` at the current chunk; loads go to ``pending``."""
        env = {**env, self.inner: self.kc}
        out = []
        for j in range(self.plan.vector):
            self.slot = j
            out.append(self.p.expr(expr, env, ext, acc))  # type: ignore[arg-type]
        return out

    def flush(self) -> None:
        for text in self.pending:
            self.line(text)
        self.pending = []

    def named(self, values: list[str], prefix: str) -> list[str]:
        """Emit the pending loads, then each of ``values`` as a fresh const variable; their names."""
        self.flush()
        names = [self.var(prefix) for _ in values]
        for name, value in zip(names, values, strict=True):
            self.line(f"const {self.ctype} {name} = {value};")
        return names

    def guarded(self, text: str, *extra: str) -> None:
        conds = [c for c in (self.guard, *extra) if c]
        self.line(f"if ({' && '.join(conds)}) {{ {text} }}" if conds else text)

    # -- members -------------------------------------------------------------------------------

    def pointwise(self, nest: LoopNest, env: dict[str, str]) -> None:
        st, ext = nest.statement, extents(nest)

        def body() -> None:
            names = self.named(self.values(st.body, env, ext), "o")
            self.store(st.write, {**env, self.inner: self.kc}, ext, names)

        self.chunks(body)

    def store(self, write: Access, env: dict[str, str], ext: dict[str, int], names: list[str]) -> None:
        plan, buf = self.plan, self.buffers[write.tensor]
        if write.tensor in plan.kept:
            arr = self.var("t")
            self.line(f"{self.ctype} {arr}[{plan.vector}] = {{{', '.join(names)}}};")
            self.scopes[-1][(write.tensor, self.p.offset(write.tensor, write.index, env, ext))] = arr
            if _local(plan.group, write.tensor):
                return
        if vectorizable(write, buf.shape, buf.dtype, self.inner, plan.vector):
            ptr = f"{self.p.names[write.tensor]} + {self.p.offset(write.tensor, write.index, env, ext)}"
            words = [self.pack(buf.dtype, names, w) for w in range(len(names) * _VECTOR_DTYPES[buf.dtype] // 4)]
            for text in store_words(ptr, words, plan.streamed(buf)):
                self.guarded(text, "valid")
            return
        for j, name in enumerate(names):
            at = {**env, self.inner: f"({self.kc} + {j})"}
            self.guarded(self.p.store(write, at, ext, name), "valid")

    def reduction(self, nest: LoopNest, env: dict[str, str]) -> None:
        st, ext = nest.statement, extents(nest)
        assert st.combiner is not None
        acc = self.var("acc")
        self.line(f"{self.ctype} {acc} = {literal(st.combiner.identity, self.ctype)};")

        def body() -> None:
            vals = [self.keep(v) for v in self.values(st.body, env, ext)]
            self.guarded(" ".join(combine(st.combiner.value, acc, v) for v in vals))  # type: ignore[union-attr]

        self.chunks(body)
        self.fold([acc], merger("", nest))
        self.reduced((nest,), env, [acc])

    def online(self, first: LoopNest, second: LoopNest, env: dict[str, str]) -> None:
        ext = extents(first)
        m, s = self.var("m"), self.var("s")
        self.line(f"{self.ctype} {m} = {literal(-math.inf, self.ctype)}, {s} = {literal(0.0, self.ctype)};")

        def body() -> None:
            xs = self.named(self.values(first.statement.body, env, ext), "x")
            cm, cs = self.var("cm"), self.var("cs")
            chunk_max = xs[0]
            for x in xs[1:]:
                chunk_max = f"k_max({chunk_max}, {x})"
            exp = self.gen.exp  # type: ignore[attr-defined]
            total = " + ".join(f"{exp}({x} - {cm})" for x in xs)
            self.guarded(f"const {self.ctype} {cm} = {chunk_max}; const {self.ctype} {cs} = {total}; "
                         f"k_online({m}, {s}, {cm}, {cs});")

        self.chunks(body)
        self.fold([m, s], merger("softmax", first))
        self.reduced((first, second), env, [m, s])

    def welford(self, first: LoopNest, second: LoopNest, env: dict[str, str]) -> None:
        """A mean and the sum of squared deviations from it in one pass: each chunk's (count, mean, M2) merged
        into the lane's with Chan's formula (``k_welford``), then across lanes the same way."""
        ext, t = extents(first), self.ctype
        n, m, q = self.var("wn"), self.var("wm"), self.var("wq")
        zero = literal(0.0, t)
        self.line(f"{t} {n} = {zero}, {m} = {zero}, {q} = {zero};")

        def body() -> None:
            xs = [self.keep(v) for v in self.values(first.statement.body, env, ext)]
            cm, cq = self.var("cm"), self.var("cq")
            width = len(xs)
            squares = " + ".join(f"({x} - {cm}) * ({x} - {cm})" for x in xs)
            self.guarded(f"const {t} {cm} = ({' + '.join(xs)}) * {literal(1 / width, t)}; const {t} {cq} = {squares}; "
                         f"k_welford({n}, {m}, {q}, {literal(width, t)}, {cm}, {cq});")

        self.chunks(body)
        self.fold([n, m, q], merger("welford", first))
        self.reduced((first, second), env, [n, m, q])

    def reduced(self, span: tuple[LoopNest, ...], env: dict[str, str], accs: list[str]) -> None:
        """The results of a reduction pass from its accumulators folded over the row: ``[acc]`` of one reduction,
        ``[max, sum]`` of a softmax pair, ``[count, mean, M2]`` of a Welford pair (see :func:`merger`)."""
        if len(span) == 1:
            self.result(span[0], env, accs[0])
        elif len(accs) == 2:
            self.result(span[0], env, accs[0])
            self.result(span[1], env, accs[1])
        else:
            self.result(span[0], env, f"({accs[1]} * {accs[0]})")
            self.result(span[1], env, accs[2])

    def fold(self, accs: list[str], merge: object) -> None:
        """Combine the per-lane ``accs`` across the row's lanes; every lane ends with the row's values. Past a
        warp, each warp's first lane leaves its values in shared memory; every group of ``warps per row`` lanes
        then reads all of the row's and folds them again with shuffles."""
        lanes = self.plan.lanes
        self.shuffle(accs, merge, min(lanes, 32))
        if lanes <= 32:
            return
        warps, per = self.plan.threads // 32, lanes // 32
        self.line("if (tid % 32 == 0) { " + " ".join(
            f"k_part[{i * warps} + tid / 32] = {a};" for i, a in enumerate(accs)) + " }")
        self.line("__syncthreads();")
        first = f"(tid / {lanes}) * {per}"
        self.line(" ".join(f"{a} = k_part[{i * warps} + {first} + tid % {per}];" for i, a in enumerate(accs)))
        self.shuffle(accs, merge, per)
        self.line("__syncthreads();")

    def shuffle(self, accs: list[str], merge: object, width: int) -> None:
        """Fold ``accs`` across groups of ``width`` (a power of two up to 32) lanes with xor shuffles."""
        for offset in (16, 8, 4, 2, 1):
            if offset < width:
                others = [f"__shfl_xor_sync(0xffffffffu, {a}, {offset})" for a in accs]
                tmp = [self.var("y") for _ in accs]
                decl = " ".join(f"const {self.ctype} {t} = {o};" for t, o in zip(tmp, others, strict=True))
                self.line(f"{{ {decl} {merge(accs, tmp)} }}")  # type: ignore[operator]

    def result(self, nest: LoopNest, env: dict[str, str], acc: str) -> None:
        """Apply the epilogue in every lane; keep the value in a register and store it where it is needed."""
        st, ext = nest.statement, extents(nest)
        value = acc if st.epilogue is None else self.p.expr(st.epilogue, env, ext, acc)
        self.flush()
        name = self.var("r")
        self.line(f"const {self.ctype} {name} = {value};")
        write = st.write
        if write.tensor in self.plan.kept:
            self.scopes[-1][(write.tensor, self.p.offset(write.tensor, write.index, env, ext))] = name
            if _local(self.plan.group, write.tensor):
                return
        leader = "valid && lane == 0" + (" && k_split == 0" if self.plan.split > 1 else "")
        self.line(f"if ({leader}) {{ {self.p.store(write, env, ext, name)} }}")

    # -- expressions (called by the printer) ---------------------------------------------------

    def expr(self, expr: Expr, env: Env, ext: dict[str, int], acc: str | None) -> str:
        """``expr`` printed, reusing values this scope already computed, a division by a per-row value
        printed as a multiplication by its reciprocal (computed once)."""
        if isinstance(expr, Call) and expr.op == "div" and self.per_row(expr.args[1]):
            num, den = (self.p.expr(a, env, ext, acc) for a in expr.args)
            return f"({num} * {self.hoist(f'(({self.ctype})1 / {den})')})"
        return self.reuse(self.p.plain(expr, env, ext, acc))  # type: ignore[attr-defined]

    def per_row(self, expr: Expr) -> bool:
        """Whether ``expr`` has one value per row (no accumulator, no load along the inner dim)."""
        return not any(isinstance(e, Acc) or isinstance(e, Load) and self.inner in e.access.dims()
                       for e in walk(expr))

    def reuse(self, text: str) -> str:
        return next((scope[("@expr", text)] for scope in reversed(self.scopes) if ("@expr", text) in scope), text)

    def hoist(self, text: str) -> str:
        """A name for ``text``, declared (through ``pending``) the first time in this scope."""
        known = self.reuse(text)
        if known != text:
            return known
        name = self.var("q")
        self.pending.append(f"const {self.ctype} {name} = {text};")
        self.scopes[-1][("@expr", text)] = name
        return name

    def keep(self, text: str) -> str:
        """``text`` (a per-element value) as a name later members reuse; flushes ``pending`` first."""
        name = text if _NAMED.fullmatch(text) else self.hoist(text)
        self.flush()
        return name

    # -- loads (called by the printer) ---------------------------------------------------------

    def load(self, access: Access, env: dict[str, str], ext: dict[str, int]) -> str:
        key = (access.tensor, self.p.offset(access.tensor, access.index, env, ext))
        if access.fill is None:
            for scope in reversed(self.scopes):
                if key in scope:
                    name = scope[key]
                    return f"{name}[{self.slot}]" if self.inner in access.dims() else name
        if self.inner not in access.dims():
            name = self.var("s")
            self.pending.append(f"const {self.ctype} {name} = {Printer.load(self.p, access, env, ext)};")
            self.scopes[-1][key] = name
            return name
        plan, buf = self.plan, self.buffers[access.tensor]
        name = self.var("v")
        self.pending.append(f"{self.ctype} {name}[{plan.vector}];")
        loads = []
        if vectorizable(access, buf.shape, buf.dtype, self.inner, plan.vector):
            ptr = f"{self.p.names[access.tensor]} + {key[1]}"
            copy = self.shared_copy(access)
            shared = access.tensor in self.fetched
            loads, words = ([], self.ready[key]) if key in self.ready else load_words(
                copy if shared else ptr, plan.vector * _VECTOR_DTYPES[buf.dtype] // 4, f"{name}w",
                plan.streamed(buf) and not shared)
            if copy and not shared:
                loads += store_words(copy, words)
                self.fetching.add(access.tensor)
            loads += [f"{name}[{j}] = {self.unpack(buf.dtype, words, j)};" for j in range(plan.vector)]
        else:
            for j in range(plan.vector):
                at = {**env, self.inner: f"({self.kc} + {j})"}
                loads.append(f"{name}[{j}] = {Printer.load(self.p, access, at, ext)};")
        body = " ".join(loads)
        self.pending.append(f"if ({self.guard}) {{ {body} }}" if self.guard else f"{{ {body} }}")
        if access.fill is None:
            self.scopes[-1][key] = name
        return f"{name}[{self.slot}]"

    def shared_copy(self, access: Access) -> str:
        """The shared-memory address of this lane's words of a staged input at the current chunk, or ""."""
        plan = self.plan
        if access.tensor not in plan.staged or access.fill is not None:
            return ""
        dtype = self.buffers[access.tensor].dtype
        return (f"(k_smem + {plan.staged[access.tensor]} + (int)(tid / {plan.lanes}) * {plan.row_bytes(dtype)} + "
                f"(int){self.kc} * {_VECTOR_DTYPES[dtype]})")

    # -- words ---------------------------------------------------------------------------------

    def pack(self, dtype: DType, names: list[str], w: int) -> str:
        """32-bit word ``w`` of the values ``names`` stored as ``dtype``."""
        if dtype == DType.FLOAT32:
            return f"__float_as_uint({names[w]})"
        conv = "k_f2h" if dtype == DType.FLOAT16 else "k_f2bf"
        lo, hi = (f"(unsigned int){conv}((float)({names[2 * w + i]}))" for i in range(2))
        return f"({lo} | ({hi} << 16))"

    def unpack(self, dtype: DType, words: list[str], j: int) -> str:
        """Element ``j`` of the loaded 32-bit ``words`` as the compute type."""
        if dtype == DType.FLOAT32:
            return f"(({self.ctype})__uint_as_float({words[j]}))"
        conv = "k_h2f" if dtype == DType.FLOAT16 else "k_bf2f"
        return f"(({self.ctype}){conv}((unsigned short)({words[j // 2]} >> {16 * (j % 2)})))"


def _piece(nwords: int) -> tuple[str, str, int]:
    """(type, fields, words) of the widest word group (<= 16 bytes) dividing ``nwords``."""
    per = 4 if nwords % 4 == 0 else 2 if nwords % 2 == 0 else 1
    ctype, fields = _PIECES[4 * per]
    return ctype, fields, per


def _read(address: str, stream: bool) -> str:
    """The value at the typed pointer ``address``, with an evict-first hint if ``stream``."""
    return f"__ldcs({address})" if stream else f"*{address}"


def load_words(ptr: str, nwords: int, name: str, stream: bool = False) -> tuple[list[str], list[str]]:
    """Statements loading ``nwords`` 32-bit words at ``ptr`` (aligned) into ``name<i>`` (evict-first if
    ``stream``), and the word expressions."""
    ctype, fields, per = _piece(nwords)
    lines, words = [], []
    for i in range(0, nwords, per):
        piece = f"{name}_{i // per}"
        lines.append(f"const {ctype} {piece} = {_read(f'(const {ctype}*)((const char*)({ptr}) + {4 * i})', stream)};")
        words += [f"{piece}.{f}" for f in fields] if fields else [piece]
    return lines, words


def store_words(ptr: str, words: list[str], stream: bool = False) -> list[str]:
    """Statements storing the 32-bit ``words`` at ``ptr`` (aligned; evict-first if ``stream``)."""
    ctype, _, per = _piece(len(words))
    out = []
    for i in range(0, len(words), per):
        value = words[i] if per == 1 else f"make_{ctype}({', '.join(words[i: i + per])})"
        address = f"({ctype}*)((char*)({ptr}) + {4 * i})"
        out.append(f"__stcs({address}, {value});" if stream else f"*{address} = {value};")
    return out
