"""C with OpenMP from a ``Schedule``: one function ``tb_kernel(b0, b1, ...)`` running every group in order.

A group is a nest of row loops (``reorder``-ed, strip-mined by ``tile``, the outer ``parallel`` of them
collapsed into one ``omp parallel for``) around its members. A member loops over the points of the row
tiles, its own inner parallel dims and its reduction dims. A reduction member whose parallel dims are all
row dims keeps one accumulator per tile point (register blocking) inside the reduction loops; otherwise it
keeps a scalar accumulator folded ``serial``-ly, with ``omp simd reduction`` (``simd``) or over ``lanes``
partial accumulators. A group without parallel dims runs its reduction with ``omp parallel for reduction``
when ``parallel`` is set. The innermost parallel loop carries ``omp simd simdlen(vector)`` or, without
it, ``GCC unroll``.
"""

from __future__ import annotations

import math

from embed.ir import DType
from embed.loopnest import Dim, LoopNest
from transforms.codegen.expr import STORAGE_C, Printer, combine, extents, literal, prelude
from transforms.codegen.kernel import Kernel, codegen_context
from transforms.run import Launch
from transforms.schedule import Group, Schedule

ENTRY = "tb_kernel"
_OMP_REDUCTION = {"sum": "+", "max": "max", "min": "min"}


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 1

    def line(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    def open(self, head: str) -> None:
        self.line(head + " {")
        self.depth += 1

    def close(self, n: int = 1) -> None:
        for _ in range(n):
            self.depth -= 1
            self.line("}")


def generate_c(schedule: Schedule) -> Kernel:
    """The C source and launch of ``schedule`` (see the module docstring)."""
    return _CGen(schedule).kernel()


class _CGen:
    def __init__(self, schedule: Schedule) -> None:
        self.s = schedule
        context = codegen_context(schedule.program)
        self.ctype, self.sig, self.buffers = context.ctype, context.sig, context.buffers
        self.p = Printer(self.buffers, self.sig.names, self.ctype)
        self.w = _Writer()
        self.fresh = 0

    def var(self, prefix: str) -> str:
        self.fresh += 1
        return f"{prefix}{self.fresh}"

    def kernel(self) -> Kernel:
        for group in self.s.groups:
            self.group(group)
        head = ["#include <math.h>", "#define HALF _Float16", prelude(self.ctype, "static inline")]
        for name in self.sig.consts:
            b = self.buffers[name]
            values = ", ".join(literal(v, self.ctype) for v in b.value or ())
            head.append(f"static const {self.ctype} {self.sig.names[name]}[{b.numel}] = {{{values}}};")
        params = []
        for arg in self.sig.args:
            ctype = self.ctype if arg.kind == "scratch" else STORAGE_C[self._dtype(arg.name)]
            const = "const " if arg.kind == "input" else ""
            params.append(f"{const}{ctype}* restrict {arg.name}")
        body = "\n".join(self.w.lines)
        code = "\n".join(head) + f"\nvoid {ENTRY}({', '.join(params)}) {{\n{body}\n}}\n"
        return Kernel("cpu", code, (Launch(ENTRY, self.sig.args),))

    def _dtype(self, arg: str) -> DType:
        name = next(n for n, a in self.sig.names.items() if a == arg)
        return self.buffers[name].dtype

    # -- groups -------------------------------------------------------------------------------

    def group(self, g: Group) -> None:
        w, s = self.w, self.s
        w.open("")  # a scope per group
        order = s.row_order(g)
        par = min(s.parallel, len(order))
        rows: dict[str, tuple[str, int, int]] = {}  # frame role -> (base var, extent, tile)
        for k, role in enumerate(order):
            extent, tile = g.row_extent(role), min(self.row_tile(g, role), g.row_extent(role))
            var = self.var("i")
            if k == 0 and par:
                w.line(f"#pragma omp parallel for collapse({par}) schedule(static)")
            step = f"{var} += {tile}" if tile > 1 else f"{var}++"
            w.open(f"for (idx_t {var} = 0; {var} < {extent}; {step})")
            rows[role] = (var, extent, tile)
        for nest in g.members:
            self.member(g, nest, rows, par_reduce=s.parallel > 0 and not order)
        w.close(len(order))
        w.close()

    def row_tile(self, g: Group, role: str) -> int:
        """``tile(role)``; in a group with a ragged member under ``sparse(csr,V)``, V for the column role, else 1."""
        kind, width = self.s.sparse
        if kind != "csr" or width == 1 or not any(_ragged(n) and len(n.parallel) == g.depth for n in g.members):
            return self.s.tile(role)
        return width if role == g.rows[-1] else 1

    def member(self, g: Group, nest: LoopNest, rows: dict[str, tuple[str, int, int]], par_reduce: bool) -> None:
        w = self.w
        env: dict[str, str] = {}
        points: list[tuple[str, str, int]] = []  # (point var, bound, tile) of tiled rows, in row order
        frame_dims = [d.name for d in g.frame.parallel[: g.depth]]
        own = {frame_dims[k]: d.name for k, d in enumerate(nest.parallel[: g.depth])}
        for role, (var, extent, tile) in rows.items():
            if tile > 1:
                t = self.var("t")
                bound = str(tile) if extent % tile == 0 else f"({tile} < {extent} - {var} ? {tile} : {extent} - {var})"
                points.append((t, bound, tile))
                env[own[role]] = f"({var} + {t})"
            else:
                env[own[role]] = var
        inner = list(nest.parallel[g.depth:])
        w.open("")
        blockable = not _ragged(nest) or self.s.sparse[0] == "csr" and self.s.sparse[1] > 1  # see row_tile
        if nest.statement.combiner is not None and not inner and points and blockable:
            self.blocked(nest, env, points)
        else:
            opened = 0
            loops: list[tuple[str, str]] = [(t, bound) for t, bound, _ in points]
            for d in inner:
                env[d.name] = self.var("j")
                loops.append((env[d.name], str(d.extent)))
            for k, (v, bound) in enumerate(loops):
                if k == len(loops) - 1 and nest.statement.combiner is None:
                    self.loop_pragmas()
                w.open(f"for (idx_t {v} = 0; {v} < {bound}; {v}++)")
                opened += 1
            if nest.statement.combiner is None:
                w.line(self.p.store(nest.statement.write, env, extents(nest), self.p.expr(nest.statement.body, env,
                                                                                        extents(nest))))
            else:
                self.scalar_reduction(nest, env, par_reduce and not loops)
            w.close(opened)
        w.close()

    def loop_pragmas(self) -> None:
        if self.s.vector > 1:  # a loop takes one of the two pragmas: simd wins
            self.w.line(f"#pragma omp simd simdlen({self.s.vector})")
        elif self.s.unroll > 1:
            self.w.line(f"#pragma GCC unroll {self.s.unroll}")

    # -- reductions ---------------------------------------------------------------------------

    def reduction_loops(self, nest: LoopNest, env: dict[str, str], upto: int) -> int:
        """Open the first ``upto`` reduction loops (outer -> inner); returns how many were opened."""
        for d in nest.reduction[:upto]:
            v = self.var("r")
            lo, hi = self.bounds(nest, d, env)
            self.w.open(f"for (idx_t {v} = {lo}; {v} < {hi}; {v}++)")
            env[d.name] = v
        return len(nest.reduction[:upto])

    def bounds(self, nest: LoopNest, d: Dim, env: dict[str, str]) -> tuple[str, str]:
        if d.ragged is None:
            return "0", str(d.extent)
        return self.p.index(d.ragged.start, env, extents(nest)), self.p.index(d.ragged.stop, env, extents(nest))

    def finish(self, nest: LoopNest, env: dict[str, str], acc: str) -> None:
        st = nest.statement
        value = acc if st.epilogue is None else self.p.expr(st.epilogue, env, extents(nest), acc)
        self.w.line(self.p.store(st.write, env, extents(nest), value))

    def scalar_reduction(self, nest: LoopNest, env: dict[str, str], par_reduce: bool) -> None:
        w, s, st = self.w, self.s, nest.statement
        assert st.combiner is not None
        comb = st.combiner.value
        acc = self.var("acc")
        ident = literal(st.combiner.identity, self.ctype)
        w.line(f"{self.ctype} {acc} = {ident};")
        red = nest.reduction
        omp = _OMP_REDUCTION[comb]
        par = par_reduce and red[0].ragged is None
        if par and len(red) > 1:
            w.line(f"#pragma omp parallel for reduction({omp}:{acc}) schedule(static)")
        opened = self.reduction_loops(nest, env, len(red) - 1)
        last = red[-1]
        lo, hi = self.bounds(nest, last, env)
        v = self.var("r")
        env[last.name] = v
        lanes = s.lanes if s.reduce == "lanes" and not par else 1
        if last.ragged is not None and s.sparse[0] == "ell":
            ok = self.ell_loop(v, lo, hi, s.sparse[1], f"{omp}:{acc}")
            w.line(combine(comb, acc, f"({ok} ? {self.p.expr(st.body, env, extents(nest))} : {ident})"))
            w.close(opened + 2)
            self.finish(nest, env, acc)
            return
        if lanes > 1:
            part = self.var("part")
            w.line(f"{self.ctype} {part}[{lanes}];")
            w.line(f"for (int u = 0; u < {lanes}; u++) {part}[u] = {ident};")
            base = self.var("r")
            w.open(f"for (idx_t {base} = {lo}; {base} + {lanes} <= {hi}; {base} += {lanes})")
            w.line(f"#pragma GCC unroll {lanes}")
            w.open(f"for (int u = 0; u < {lanes}; u++)")
            w.line(f"const idx_t {v} = {base} + u;")
            w.line(combine(comb, f"{part}[u]", self.p.expr(st.body, env, extents(nest))))
            w.close(2)
            w.line(f"for (int u = 0; u < {lanes}; u++) {combine(comb, acc, f'{part}[u]')}")
            w.open(f"for (idx_t {v} = {lo} + ({hi} - {lo}) / {lanes} * {lanes}; {v} < {hi}; {v}++)")
        else:
            simd = "simd " if s.reduce == "simd" else ""
            if par and len(red) == 1:
                w.line(f"#pragma omp parallel for {simd}reduction({omp}:{acc}) schedule(static)")
            elif simd:
                w.line(f"#pragma omp simd reduction({omp}:{acc})")
            elif s.unroll > 1:
                w.line(f"#pragma GCC unroll {s.unroll}")
            w.open(f"for (idx_t {v} = {lo}; {v} < {hi}; {v}++)")
        w.line(combine(comb, acc, self.p.expr(st.body, env, extents(nest))))
        w.close(opened + 1)
        self.finish(nest, env, acc)

    def ell_loop(self, v: str, lo: str, hi: str, width: int, reduction: str) -> str:
        """Open chunks of ``width`` nonzeros of ``[lo, hi)`` and a predicated lane loop binding ``v`` (closes: 2);
        returns the predicate. Past ``hi``, ``v`` stays a valid index (``lo``) and the caller adds the identity."""
        base, ok = self.var("e"), self.var("ok")
        self.w.open(f"for (idx_t {base} = {lo}; {base} < {hi}; {base} += {width})")
        self.w.line(f"#pragma omp simd simdlen({width}) reduction({reduction})")
        self.w.open(f"for (int u = 0; u < {width}; u++)")
        self.w.line(f"const int {ok} = {base} + u < {hi};")
        self.w.line(f"const idx_t {v} = {ok} ? {base} + u : {lo};")
        return ok

    def blocked(self, nest: LoopNest, env: dict[str, str], points: list[tuple[str, str, int]]) -> None:
        """One accumulator per point of the row tiles, the point loops inside the reduction loops."""
        w, st = self.w, nest.statement
        assert st.combiner is not None
        comb = st.combiner.value
        sizes = [tile for _, _, tile in points]
        acc = self.var("acc")
        total = math.prod(sizes)
        slot = " + ".join(f"{t} * {math.prod(sizes[k + 1:])}" for k, (t, _, _) in enumerate(points))
        w.line(f"{self.ctype} {acc}[{total}];")
        w.line(f"for (int u = 0; u < {total}; u++) {acc}[u] = {literal(st.combiner.identity, self.ctype)};")
        opened = self.reduction_loops(nest, env, len(nest.reduction))

        def point_loops() -> None:
            for k, (t, bound, _) in enumerate(points):
                if k == len(points) - 1:
                    self.loop_pragmas()
                w.open(f"for (idx_t {t} = 0; {t} < {bound}; {t}++)")

        point_loops()
        w.line(combine(comb, f"{acc}[{slot}]", self.p.expr(st.body, env, extents(nest))))
        w.close(len(points) + opened)
        point_loops()
        self.finish(nest, env, f"{acc}[{slot}]")
        w.close(len(points))


def _ragged(nest: LoopNest) -> bool:
    return any(d.ragged is not None for d in nest.reduction)
