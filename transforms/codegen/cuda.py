"""CUDA C++ from a ``Schedule``: one ``extern "C" __global__`` kernel per group, launched in group order.

A group's row dims are flattened into a row index; each row is handled by ``L`` lanes (threads): ``reduce``
``thread`` gives L = 1 (one thread per row), ``warp`` L = 32, ``block`` L = ``threads / rows_per_block``
(a multiple of 32). A block holds ``threads / L`` rows. Inside a row, a member's inner parallel points are
strided across the lanes (each lane then reduces serially); a member with only reduction dims strides its
flattened reduction space across the lanes and folds the partials with ``__shfl_xor_sync`` (and shared
memory across warps when L > 32). Members are separated by ``__syncwarp`` / ``__syncthreads``, so later
members see what earlier ones wrote. Groups without reductions use one thread per row point.
A group with a single row (a whole-tensor reduction) always gets a block of :data:`MAX_THREADS` lanes.
Half floats travel as raw 16 bits converted with PTX ``cvt``; no CUDA header is needed. Where every output is a
16-bit float, :data:`FAST_MATH` replaces ``exp`` (PTX ``ex2.approx``, relative error near 1e-7) and exact ``gelu``
(:func:`fast_gelu_source`, within one fp16 ulp): both below what those outputs keep. With
``row_mode`` set,
groups of row shape run as row kernels instead (vector accesses, rows in registers: ``cuda_rows``); with ``stage``
set, strided pointwise nests go through shared-memory tiles (tiled transposes: ``cuda_stage``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from embed.ir import DType
from embed.loopnest import Call, Dim, LoopNest
from transforms.codegen.cuda_rows import RowEmitter, persistent_grid, plan_rows
from transforms.codegen.cuda_stage import emit_staged, plan_group
from transforms.codegen.expr import Printer, combine, extents, literal, prelude
from transforms.codegen.kernel import Kernel, codegen_context, cuda_consts, cuda_params
from transforms.run import Launch
from transforms.schedule import Group, Schedule

CUDA_HEAD = """
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
#define HALF unsigned short
__device__ static inline float k_h2f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ static inline unsigned short k_f2h(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
"""
_ONLINE = """
__device__ static inline void k_online(T& m, T& s, T m2, T s2) {
  const T mn = m > m2 ? m : m2;
  s = (m == mn ? s : s * EXP(m - mn)) + (m2 == mn ? s2 : s2 * EXP(m2 - mn));
  m = mn;
}
__device__ static inline void k_welford(T& n, T& m, T& q, T n2, T m2, T q2) {
  if (n2 == (T)0) return;
  const T all = n + n2, d = m2 - m, f = n2 / all;
  m += d * f; q += q2 + d * d * n * f; n = all;
}
"""
#: Abramowitz & Stegun 7.1.26: for z >= 0, erfc(z) = t (a1 + a2 t + ... + a5 t^4) exp(-z^2) within 1.5e-7,
#: t = 1 / (1 + p z); these are p and a1..a5.
ERF_P = 0.3275911
ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def fast_gelu_source() -> str:
    """``k_fgelu``: exact GELU x Phi(x) with Phi from :data:`ERF_P` / :data:`ERF_A`, the fast reciprocal and
    exponential, about half the instructions of ``erff`` (which held bias+gelu at 1.4x the DRAM bound:
    ``bench/results/kernel_probe_h200.md``). Phi(x) = erfc(|z|) / 2 for x < 0 and 1 - erfc(|z|) / 2 otherwise
    (z = x / sqrt 2), so nothing cancels: within one fp16 ulp of GELU everywhere, where ``1 + erff(z)`` loses
    the negative tail."""
    horner = f"{ERF_A[-1]!r}f"
    for a in reversed(ERF_A[:-1]):
        horner = f"fmaf({horner}, t, {a!r}f)"
    return f"""
__device__ static inline float k_fgelu(float x) {{
  const float a = fabsf(x) * 0.70710678118654752440f, t = __fdividef(1.0f, fmaf({ERF_P!r}f, a, 1.0f));
  const float erfc = {horner} * t * k_fexp(-a * a);
  return 0.5f * x * (x < 0.0f ? erfc : 2.0f - erfc);
}}
"""


_FAST_EXP = """
__device__ static inline float k_fexp(float x) {
  float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.44269504088896341f)); return y;
}
"""
#: Op -> helper of the fast math used where every output is a 16-bit float (defined by :data:`_FAST_EXP` and
#: :func:`fast_gelu_source`).
FAST_MATH = {"exp": "k_fexp", "gelu": "k_fgelu"}
DEFAULT_THREADS = 256
MAX_THREADS = 1024


class _HookedPrinter(Printer):
    """A printer whose loads and expressions a row emitter may take over (register-held values, vector loads),
    printing the ops of ``fast_math`` through its helpers."""

    rows: RowEmitter | None = None
    fast_math: Mapping[str, str] = MappingProxyType({})

    def load(self, access, env, extents):  # type: ignore[no-untyped-def]
        return self.rows.load(access, env, extents) if self.rows else super().load(access, env, extents)

    def expr(self, expr, env, extents, acc=None):  # type: ignore[no-untyped-def]
        return self.rows.expr(expr, env, extents, acc) if self.rows else self.plain(expr, env, extents, acc)

    def plain(self, expr, env, extents, acc=None):  # type: ignore[no-untyped-def]
        """``Printer.expr`` (its operands through ``expr``), with the ``fast_math`` helpers."""
        if isinstance(expr, Call) and expr.op in self.fast_math:
            return f"{self.fast_math[expr.op]}({self.expr(expr.args[0], env, extents, acc)})"
        return super().expr(expr, env, extents, acc)


def generate_cuda(schedule: Schedule) -> Kernel:
    """The CUDA source of ``schedule`` and one launch per group (see the module docstring)."""
    if schedule.gemm is not None:  # a contraction under the gemm step: transforms.codegen.cuda_gemm
        from transforms.codegen.cuda_gemm import generate_gemm

        return generate_gemm(schedule)
    if schedule.sparse[0] == "merge":  # a CSR product split by nonzeros: transforms.codegen.cuda_spmm
        from transforms.codegen.cuda_spmm import generate_spmm

        return generate_spmm(schedule)
    if schedule.reduce == "split":  # rows cut across blocks: transforms.codegen.cuda_split
        from transforms.codegen.cuda_split import generate_split

        return generate_split(schedule)
    return CudaGen(schedule).kernel()


class CudaGen:
    """The CUDA module of one schedule (``kernel()``): a launch per group, row groups through ``cuda_rows``;
    ``cuda_split`` extends it for ``reduce(split,S)``."""

    def __init__(self, schedule: Schedule) -> None:
        self.s = schedule
        context = codegen_context(schedule.program)
        self.ctype, self.sig, self.buffers = context.ctype, context.sig, context.buffers
        self.p = _HookedPrinter(self.buffers, self.sig.names, self.ctype, "k_h2f({0})", "k_f2h((float)({0}))")
        half = all(self.buffers[n].dtype in (DType.FLOAT16, DType.BFLOAT16) for n in schedule.program.outputs)
        fast = half and self.ctype == "float"
        self.exp = FAST_MATH["exp"] if fast else "expf" if self.ctype == "float" else "exp"
        self.p.fast_math = FAST_MATH if fast else {}
        self.lines: list[str] = []
        self.fresh = 0
        self.shared_bytes = 0  # dynamic shared memory of the group being generated
        self.min_blocks = 0  # blocks per SM its launch bounds ask for (persistent row kernels); 0: none

    def var(self, prefix: str) -> str:
        self.fresh += 1
        return f"{prefix}{self.fresh}"

    def line(self, text: str) -> None:
        self.lines.append("  " + text)

    def kernel(self) -> Kernel:
        params = cuda_params(self.sig, self.buffers, self.ctype)
        online = _ONLINE.replace("EXP", self.exp).replace("T", self.ctype)
        fast = _FAST_EXP + fast_gelu_source() if self.p.fast_math else ""
        head = [CUDA_HEAD, prelude(self.ctype, "__device__ static inline"), fast, online]
        head += cuda_consts(self.sig, self.buffers, self.ctype)
        bodies, launches = [], []
        for k, group in enumerate(self.s.groups):
            self.lines, self.shared_bytes, self.min_blocks = [], 0, 0
            grid, block = self.group(group)
            entry = f"tb_kernel{k}"
            bounds = f"{block}, {self.min_blocks}" if self.min_blocks else f"{block}"
            bodies.append(f'extern "C" __global__ void __launch_bounds__({bounds}) {entry}({params}) '
                          f'{{\n' + "\n".join(self.lines) + "\n}")
            launches.append(Launch(entry, self.sig.args, (grid, 1, 1), (block, 1, 1), self.shared_bytes))
        return Kernel("cuda", "\n".join(head) + "\n" + "\n\n".join(bodies) + "\n", tuple(launches))

    def lanes(self, g: Group) -> tuple[int, int]:
        """(lanes per row, threads per block) for group ``g``."""
        threads = self.s.threads or DEFAULT_THREADS
        if not any(n.reduction or len(n.parallel) > g.depth for n in g.members):
            return 1, threads
        mode = self.s.reduce if self.s.reduce in ("thread", "warp", "block", "lanes") else "block"
        if mode == "thread":
            return 1, threads
        if mode == "lanes":
            return self.s.lanes, max(threads, self.s.lanes)
        if mode == "warp":
            return 32, max(threads, 32)
        lanes = max(32, threads // max(self.s.rows_per_block, 1) // 32 * 32)
        return lanes, max(threads, lanes)

    # -- one group = one kernel --------------------------------------------------------------

    def group(self, g: Group) -> tuple[int, int]:
        staged = plan_group(self.s, g)
        if staged is not None:
            return emit_staged(self, staged, *self.s.stage)
        plan = plan_rows(self.s, g, DEFAULT_THREADS)
        if plan is not None:
            g, lanes, threads = plan.group, plan.lanes, plan.threads
        else:
            if self.s.row_depth and len(g.nests) == 1 and g.depth > self.s.row_depth:
                g = Group(g.nests, self.s.row_depth, g.program)  # inner parallel dims go across the lanes
            elif self.columns(g.members[0]) > 1 and len(g.nests) == 1 and g.depth > 1:
                g = Group(g.nests, g.depth - 1, g.program)  # sparse(csr,V): the columns go across the lanes
            lanes, threads = self.lanes(g)
        rows = math.prod(g.row_extent(r) for r in g.rows)
        if plan is None and rows == 1 and lanes > 1:  # one block does all the work: give it every lane
            lanes = threads = MAX_THREADS
        per_block = threads // lanes
        blocks = max(1, -(-rows // per_block))
        frame = [d.name for d in g.frame.parallel[: g.depth]]
        self.line("const idx_t tid = threadIdx.x;")
        if plan is not None and plan.persist:  # a persistent grid: each row group loops over rows
            self.line(f"const int lane = (int)(tid % {lanes});")
            self.shared_bytes, self.min_blocks = plan.shared_bytes, plan.persist
            self.p.rows = RowEmitter(plan, self)
            self.p.rows.persistent(rows, lambda row, valid: self.row_env(g, row, valid), frame)
            self.p.rows = None
            self.lines = [ln for ln in self.lines if ln.strip()]
            return persistent_grid(plan, blocks), threads
        self.line(f"const idx_t row = (idx_t)blockIdx.x * {per_block} + tid / {lanes};")
        self.line(f"const int lane = (int)(tid % {lanes});")
        self.line(f"const bool valid = row < {rows};")
        if lanes > 32 and plan is None:
            self.line(f"__shared__ {self.ctype} k_part[{threads // 32}];")
        env = self.row_env(g, "row", "valid")
        if plan is not None:
            self.shared_bytes = plan.shared_bytes
            self.p.rows = RowEmitter(plan, self)
            self.p.rows.emit(env, frame)
            self.p.rows = None
        for k, nest in enumerate(g.members if plan is None else ()):
            own = {d.name: env[frame[i]] for i, d in enumerate(nest.parallel[: g.depth])}
            if k:
                self.line("__syncthreads();" if lanes > 32 else "__syncwarp();" if lanes > 1 else "")
            self.line("{")
            self.member(nest, dict(own), g.depth, lanes)
            self.line("}")
        self.lines = [ln for ln in self.lines if ln.strip()]
        return blocks, threads

    def row_env(self, g: Group, row: str, valid: str) -> dict[str, str]:
        """Emit ``g``'s row indices decoded from the flat row index ``row`` (row 0 where ``valid`` is false, so
        every read stays in bounds); role -> index variable."""
        env: dict[str, str] = {}
        rest = row
        for k, role in enumerate(reversed(g.rows)):
            v = self.var("i")
            extent = g.row_extent(role)
            bound = f"{valid} ? {rest} : 0" if k == len(g.rows) - 1 else f"{rest} % {extent}"
            self.line(f"const idx_t {v} = {bound};")
            rest = f"({rest} / {extent})"
            env[role] = v
        return env

    def member(self, nest: LoopNest, env: dict[str, str], depth: int, lanes: int) -> None:
        st = nest.statement
        inner = list(nest.parallel[depth:])
        ext = extents(nest)
        if st.combiner is not None and len(inner) == 1 and self.columns(nest) > 1:
            self.column_block(nest, env, inner[0], lanes)
            return
        if st.combiner is None or inner:
            count = math.prod(d.extent for d in inner)
            k = self.var("k")
            close = self.strided(k, count, lanes)
            self.decode(inner, k, env)
            if st.combiner is None:
                self.line(self.p.store(st.write, env, ext, self.p.expr(st.body, env, ext)))
            else:
                acc = self.serial_reduction(nest, env)
                self.finish(nest, env, acc)
            self.line(close)
            return
        acc = self.var("acc")
        ident = literal(st.combiner.identity, self.ctype)
        self.line(f"{self.ctype} {acc} = {ident};")
        red = nest.reduction
        k = self.var("k")
        if any(d.ragged is not None for d in red):
            if len(red) > 1:
                raise ValueError("a ragged reduction must be the nest's only reduction dim")
            ok, close = self.ragged(nest, env, k, "lane", lanes)
            self.line("  " + combine(st.combiner.value, acc, self.guard(ok, self.p.expr(st.body, env, ext), ident)))
        else:
            close = self.strided(k, math.prod(d.extent for d in red), lanes)
            self.decode(list(red), k, env)
            self.line("  " + combine(st.combiner.value, acc, self.p.expr(st.body, env, ext)))
        self.line(close)
        comb = st.combiner.value
        for offset in (16, 8, 4, 2, 1):
            if offset < min(lanes, 32):
                self.line(combine(comb, acc, f"__shfl_xor_sync(0xffffffffu, {acc}, {offset})"))
        if lanes > 32:
            self.line(f"if (tid % 32 == 0) k_part[tid / 32] = {acc};")
            self.line("__syncthreads();")
            self.line(f"{acc} = {ident};")
            first = f"(tid / {lanes}) * {lanes // 32}"
            self.line(f"for (int w = 0; w < {lanes // 32}; w++) {combine(comb, acc, f'k_part[{first} + w]')}")
            self.line("__syncthreads();")
        self.line("if (valid && lane == 0) {")
        self.finish(nest, env, acc)
        self.line("}")

    def columns(self, nest: LoopNest) -> int:
        """V of ``sparse(csr,V)`` for a ragged reduction nest, else 1."""
        kind, width = self.s.sparse
        return width if kind == "csr" and any(d.ragged is not None for d in nest.reduction) else 1

    def ragged(self, nest: LoopNest, env: dict[str, str], k: str, lane: str, lanes: int) -> tuple[str, str]:
        """Open the loop over nest's ragged dim (bound to ``k``), lane ``lane`` of ``lanes`` taking every
        ``lanes``-th nonzero; returns (predicate, closing). Under ``sparse(ell,W)`` the row is walked in chunks of
        ``lanes * W`` with the same trip count on every lane, ``k`` staying a valid index where the predicate fails."""
        (d,) = nest.reduction
        assert d.ragged is not None
        ext = extents(nest)
        lo, hi = self.p.index(d.ragged.start, env, ext), self.p.index(d.ragged.stop, env, ext)
        env[d.name] = k
        kind, width = self.s.sparse
        self.unroll()
        if kind != "ell":
            self.line(f"for (idx_t {k} = {lo} + {lane}; valid && {k} < {hi}; {k} += {lanes}) {{")
            return "", "}"
        e, u, ok = self.var("e"), self.var("u"), self.var("ok")
        self.line(f"for (idx_t {e} = {lo}; valid && {e} < {hi}; {e} += {lanes * width}) {{")
        self.line("#pragma unroll")
        self.line(f"for (int {u} = 0; {u} < {width}; {u}++) {{")
        self.line(f"  const bool {ok} = {e} + {u} * {lanes} + {lane} < {hi};")
        self.line(f"  const idx_t {k} = {ok} ? {e} + {u} * {lanes} + {lane} : {lo};")
        return ok, "}}"

    @staticmethod
    def guard(ok: str, value: str, ident: str) -> str:
        return f"({ok} ? {value} : {ident})" if ok else value

    def column_block(self, nest: LoopNest, env: dict[str, str], column: Dim, lanes: int) -> None:
        """``sparse(csr,V)``: each lane reduces ``V`` consecutive columns over the row's nonzeros, reading each
        nonzero's value and index once (columns past the end are clamped on reads and not stored)."""
        st = nest.statement
        assert st.combiner is not None
        width, ext = self.columns(nest), extents(nest)
        ident = literal(st.combiner.identity, self.ctype)
        k, acc, v = self.var("k"), self.var("acc"), self.var("v")
        close = self.strided(k, -(-column.extent // width), lanes)
        self.line(f"  {self.ctype} {acc}[{width}];")
        self.line(f"  for (int {v} = 0; {v} < {width}; {v}++) {acc}[{v}] = {ident};")
        ok, close_red = self.ragged(nest, env, self.var("r"), "0", 1)
        self.line("#pragma unroll")
        self.line(f"for (int {v} = 0; {v} < {width}; {v}++) {{")
        last = column.extent - 1
        env[column.name] = f"({k} * {width} + {v} < {last} ? {k} * {width} + {v} : {last})"
        value = self.guard(ok, self.p.expr(st.body, env, ext), ident)
        self.line("  " + combine(st.combiner.value, f"{acc}[{v}]", value))
        self.line("}")
        self.line(close_red)
        self.line(f"for (int {v} = 0; {v} < {width}; {v}++) {{")
        self.line(f"  if ({k} * {width} + {v} >= {column.extent}) break;")
        env[column.name] = f"({k} * {width} + {v})"
        self.finish(nest, env, f"{acc}[{v}]")
        self.line("}")
        self.line(close)

    def strided(self, k: str, count: int, lanes: int) -> str:
        """Open a loop binding ``k`` to this lane's points of ``0..count`` (stride ``lanes``); returns its closing.
        When ``lanes`` divides ``count`` the trip count is a constant, so ``unroll`` unrolls it cleanly."""
        if count % lanes:
            self.unroll()
            self.line(f"for (idx_t {k} = lane; valid && {k} < {count}; {k} += {lanes}) {{")
            return "}"
        t = self.var("t")
        self.line("if (valid) {")
        self.unroll()
        self.line(f"for (int {t} = 0; {t} < {count // lanes}; {t}++) {{")
        self.line(f"  const idx_t {k} = lane + (idx_t){t} * {lanes};")
        return "}}"

    def unroll(self) -> None:
        if self.s.unroll > 1:
            self.line(f"#pragma unroll {self.s.unroll}")

    def decode(self, dims: list[Dim], flat: str, env: dict[str, str]) -> None:
        """Bind ``dims`` (outer -> inner) to the digits of the flat index ``flat``."""
        if len(dims) == 1:  # flat < extent already
            env[dims[0].name] = flat
            return
        rest = flat
        for d in reversed(dims):
            v = self.var("j")
            self.line(f"  const idx_t {v} = {rest} % {d.extent};")
            rest = f"({rest} / {d.extent})"
            env[d.name] = v

    def serial_reduction(self, nest: LoopNest, env: dict[str, str]) -> str:
        st = nest.statement
        assert st.combiner is not None
        acc = self.var("acc")
        ext = extents(nest)
        self.line(f"  {self.ctype} {acc} = {literal(st.combiner.identity, self.ctype)};")
        ident = literal(st.combiner.identity, self.ctype)
        if any(d.ragged is not None for d in nest.reduction):
            ok, close = self.ragged(nest, env, self.var("r"), "0", 1)
            self.line("    " + combine(st.combiner.value, acc, self.guard(ok, self.p.expr(st.body, env, ext), ident)))
            self.line(close)
            return acc
        for d in nest.reduction:
            v = self.var("r")
            self.line(f"  for (idx_t {v} = 0; {v} < {d.extent}; {v}++)")
            env[d.name] = v
        self.line("    " + combine(st.combiner.value, acc, self.p.expr(st.body, env, ext)))
        return acc

    def finish(self, nest: LoopNest, env: dict[str, str], acc: str) -> None:
        st = nest.statement
        ext = extents(nest)
        value = acc if st.epilogue is None else self.p.expr(st.epilogue, env, ext, acc)
        self.line("  " + self.p.store(st.write, env, ext, value))

