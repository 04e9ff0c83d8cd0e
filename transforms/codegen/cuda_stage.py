"""Shared-memory staging for the cuda generator (``stage`` step): tiled transposes and other strided pointwise nests.

A one-nest pointwise group qualifies when some load walks memory with a stride other than 0 or 1 along ``p0`` (the
write's contiguous dim) but with stride 1 along another parallel dim ``q``: its *staged* loads. A block owns a
``T x T`` tile of (``q``, ``p0``) at one point of the other parallel dims. It first reads every staged load over the
tile with consecutive threads along ``q`` (coalesced) into a shared tile padded by one element (no bank conflicts),
syncs, then computes the statement with consecutive threads along ``p0`` (coalesced writes), taking staged values
from the tiles and reading every other load directly. A thread handles ``E`` elements in each phase, so a block has
``T * T / E`` threads. Tiles past the extents are guarded; staged loads past :data:`SHARED_BYTES` read directly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

from embed.loopnest import Access, Load, LoopNest, walk
from transforms.codegen.expr import Env, Printer, extents
from transforms.schedule import Group, Schedule

SHARED_BYTES = 48 * 1024  # static shared memory per block
CTYPE_BYTES = {"float": 4, "double": 8}


@dataclass(frozen=True)
class StagePlan:
    """A nest staged through shared memory: the staged loads' contiguous dim ``q`` and the loads themselves."""

    nest: LoopNest
    q: str
    loads: tuple[Access, ...]  # in order of first appearance in the statement


def stage_plan(nest: LoopNest, shapes: Mapping[str, Sequence[int]]) -> StagePlan | None:
    """The staging of ``nest`` (see the module docstring; ``shapes`` of its tensors), or None when it does not
    qualify."""
    if nest.reduction or len(nest.parallel) < 2 or any(d.ragged is not None for d in nest.dims):
        return None
    others = [d.name for d in reversed(nest.parallel) if d.name != "p0"]  # inner first
    contiguous: dict[Access, str] = {}
    for node in (n for expr in nest.statement.exprs() for n in walk(expr)):
        if not isinstance(node, Load):
            continue
        shape = shapes[node.access.tensor]
        if node.access.stride("p0", shape) in (0, 1, None):
            continue
        q = next((n for n in others if node.access.stride(n, shape) == 1), None)
        if q is not None:
            contiguous.setdefault(node.access, q)
    if not contiguous:
        return None
    q = Counter(contiguous.values()).most_common(1)[0][0]
    return StagePlan(nest, q, tuple(a for a, n in contiguous.items() if n == q))


def plan_group(schedule: Schedule, g: Group) -> StagePlan | None:
    """The staging of group ``g`` under ``schedule.stage``, or None (the generic path then runs it)."""
    if not schedule.stage[0] or len(g.nests) != 1:
        return None
    return stage_plan(g.members[0], {n: b.shape for n, b in g.program.buffers.items()})


@dataclass
class _TilePrinter(Printer):
    """A printer reading staged accesses from their shared tiles."""

    tiles: Mapping[Access, str] = field(default_factory=dict)

    def load(self, access: Access, env: Env, extents: Mapping[str, int]) -> str:
        tile = self.tiles.get(access)
        return tile if tile is not None else super().load(access, env, extents)


def emit_staged(gen: object, plan: StagePlan, tile: int, per_thread: int) -> tuple[int, int]:
    """Emit the staged kernel body through the cuda generator ``gen`` (its ``line``, ``var``, printer and compute
    type); returns (blocks, threads per block)."""
    nest, q = plan.nest, plan.q
    ext = extents(nest)
    line, var = gen.line, gen.var  # type: ignore[attr-defined]
    ctype: str = gen.ctype  # type: ignore[attr-defined]
    room = max(1, SHARED_BYTES // (tile * (tile + 1) * CTYPE_BYTES[ctype]))
    tiles = {a: var("k_tile") for a in plan.loads[:room]}
    step = tile // per_thread  # tile rows a block covers per pass
    counts = {"p0": -(-ext["p0"] // tile), q: -(-ext[q] // tile)}
    rest = var("blk")
    line(f"const int tx = threadIdx.x % {tile}, ty = threadIdx.x / {tile};")
    line(f"idx_t {rest} = blockIdx.x;")
    base: dict[str, str] = {}
    for name in ("p0", q):
        base[name] = var("base")
        line(f"const idx_t {base[name]} = {rest} % {counts[name]} * {tile}; {rest} /= {counts[name]};")
    env: dict[str, str] = {}
    blocks = counts["p0"] * counts[q]
    for d in reversed(nest.parallel):
        if d.name not in base:
            env[d.name] = var("i")
            line(f"const idx_t {env[d.name]} = {rest} % {d.extent}; {rest} /= {d.extent};")
            blocks *= d.extent
    for name in tiles.values():
        line(f"__shared__ {ctype} {name}[{tile}][{tile + 1}];")

    def open_pass(across: str, down: str) -> str:
        """Open the loop over this thread's elements, consecutive threads along ``across``; returns the tile
        slot of the current element as (row: p0, column: q)."""
        e = var("e")
        line("#pragma unroll")
        line(f"for (int {e} = 0; {e} < {tile}; {e} += {step}) {{")
        for dim, offset in ((across, "tx"), (down, f"ty + {e}")):
            env[dim] = var("j")
            line(f"  const idx_t {env[dim]} = {base[dim]} + {offset};")
        line(f"  if ({env[across]} < {ext[across]} && {env[down]} < {ext[down]}) {{")
        return f"[ty + {e}][tx]" if across == q else f"[tx][ty + {e}]"

    printer: Printer = gen.p  # type: ignore[attr-defined]
    slot = open_pass(q, "p0")
    for access, name in tiles.items():
        line(f"    {name}{slot} = {printer.load(access, env, ext)};")
    line("}}")
    line("__syncthreads();")
    slot = open_pass("p0", q)
    staged = _TilePrinter(**{f.name: getattr(printer, f.name) for f in fields(Printer)},
                          tiles={a: f"{name}{slot}" for a, name in tiles.items()})
    st = nest.statement
    line("    " + staged.store(st.write, env, ext, staged.expr(st.body, env, ext)))
    line("}}")
    return max(1, blocks), tile * step
