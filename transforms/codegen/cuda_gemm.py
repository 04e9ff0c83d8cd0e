"""CUDA for a contraction (``transforms.contraction``) under a ``gemm`` step: one kernel, epilogue fused.

``mma`` (fp16/bf16 operands, fp32 accumulation): a ``tile_m x tile_n`` block tile split over a grid of warps;
operand tiles stream into shared memory through ``cp.async`` (16/8/4-byte copies as the strides allow,
zero-filled past the edges; plain loads for odd strides) in a ``stages``-deep ring, rows padded by 16 bytes
so that ``ldmatrix`` hits distinct banks; ``mma.sync.m16n8k16`` accumulates in registers. B may hold k or n
contiguously (``ldmatrix`` / ``ldmatrix.trans``). ``simt`` (fp32/fp64): register-blocked shared-memory
tiles, the next tile prefetched into registers while the current one is used; every thread computes a
strided ``rows x cols`` patch (conflict-free shared reads, coalesced stores), summing each k tile apart
before adding it in (fp32 rounding error then stays within the 1e-4 tolerance at k = 1024). Both rasterise
blocks in groups of ``swizzle`` tile rows, run batches on grid z, and apply the epilogue nests to each
accumulator before its predicated store. Under split-K (``GemmConfig.split`` = S > 1) grid z also runs the S
parts of k: each block stores its raw sums to a float32 (fp64: double) scratch ``[S, batch, m, n]``, and a second
kernel adds the S partials of each element in a fixed order (deterministic: no atomics) and applies the epilogue,
as the vendor paths' epilogue kernel does. ``cublas`` / ``cublaslt``: a library launch (``Launch.library``,
see ``transforms.vendor_blas``) writes the product, cuBLASLt with what it can apply of the epilogue (bias,
relu, tanh-gelu), where ``transforms.contraction.vendor_plan`` says (an output, in place, when one fits);
then one elementwise kernel applies the rest, each thread on several elements of a row (vector loads and
stores, 16 bytes of the narrowest buffer; one element where an output is stored through a transpose). A
reshape or transpose of the result is the epilogue's store (``transforms.views``): each element is stored where
the view puts it. Raw PTX throughout: no CUDA header is needed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from embed.ir import DType
from embed.loopnest import Access, BufferKind
from transforms.codegen.cuda import CUDA_HEAD
from transforms.codegen.expr import STORAGE_C, Env, Printer, extents, prelude
from transforms.codegen.kernel import Kernel, compute_dtype, cuda_consts, cuda_params
from transforms.codegen.signature import Signature, signature
from transforms.contraction import (
    MAX_GRID_Z,
    PAD,
    Contraction,
    GemmConfig,
    Operand,
    VendorPlan,
    match_contraction,
    row_major_store,
    vendor_plan,
)
from transforms.run import Buffer, Launch, Scalar
from transforms.schedule import Schedule, ScheduleError

EPILOGUE_THREADS = 256
VECTOR_BYTES = 16  # what a thread of the epilogue kernel loads or stores of its narrowest buffer
PARTIALS = "@split_k"  # the split-K scratch buffer's key in the kernel signature's names
#: cudaDataType_t of each dtype; cublasComputeType_t 32F and 64F.
_CUDA_TYPE = {DType.FLOAT16: 2, DType.BFLOAT16: 14, DType.FLOAT32: 0, DType.FLOAT64: 1}
_COMPUTE_32F, _COMPUTE_64F = 68, 70

_PTX_HELPERS = """
__device__ static inline unsigned k_smem(const void* p) {
  unsigned a; asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p)); return a;
}
__device__ static inline void k_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ static inline void k_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
__device__ static inline void k_ldm4(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ static inline void k_ldm4t(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ static inline void k_mma(float* d, const unsigned* a, const unsigned* b) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.ELEM.ELEM.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
"""
_VECTOR_IO = """
__device__ static inline void k_ld4(unsigned* r, const void* p) {
  asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(p));
}
__device__ static inline void k_ld2(unsigned* r, const void* p) {
  asm volatile("ld.global.v2.u32 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "l"(p));
}
__device__ static inline void k_ld1(unsigned* r, const void* p) {
  asm volatile("ld.global.u32 %0, [%1];" : "=r"(r[0]) : "l"(p));
}
__device__ static inline void k_st4(void* p, const unsigned* r) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};"
               :: "l"(p), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}
__device__ static inline void k_st2(void* p, const unsigned* r) {
  asm volatile("st.global.v2.u32 [%0], {%1,%2};" :: "l"(p), "r"(r[0]), "r"(r[1]) : "memory");
}
__device__ static inline void k_st1(void* p, const unsigned* r) {
  asm volatile("st.global.u32 [%0], %1;" :: "l"(p), "r"(r[0]) : "memory");
}
__device__ static inline unsigned k_f16x2(float lo, float hi) {
  unsigned r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ static inline unsigned k_bf16x2(float lo, float hi) {
  unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
"""
_CP_ASYNC = """
__device__ static inline void k_cp{n}(unsigned dst, const void* src, bool ok) {{
  asm volatile("cp.async.{cache}.shared.global [%0], [%1], {n}, %2;"
               :: "r"(dst), "l"(src), "r"(ok ? {n} : 0) : "memory");
}}
"""


def generate_gemm(schedule: Schedule) -> Kernel:
    """The kernel(s) and launches running ``schedule.gemm`` on the schedule's contraction program."""
    config = schedule.gemm
    contraction = match_contraction(schedule.program)
    if config is None or contraction is None:
        raise ScheduleError("gemm: the program is not a matmul followed by pointwise nests over its output")
    if not config.legal(contraction):
        raise ScheduleError(f"gemm{config.args}: not a legal configuration for this contraction")
    if math.prod(contraction.batch) > MAX_GRID_Z:  # (split-K parts are legal only while they fit as well)
        raise ScheduleError(f"gemm: {math.prod(contraction.batch)} batches exceed the grid's z limit {MAX_GRID_Z}")
    return _GemmGen(contraction, config).kernel()


@dataclass
class EpiloguePrinter(Printer):
    """A Printer whose loads of buffers computed earlier in the thread read local variables instead."""

    local: dict[str, str] = field(default_factory=dict)

    def load(self, access: Access, env: Env, extents: Mapping[str, int]) -> str:
        return self.local.get(access.tensor) or super().load(access, env, extents)


def _vector(op: Operand, contiguous_extent: int) -> int:
    """Elements per copy of ``op``'s contiguous rows: the widest of 8, 4, 2 dividing every other stride."""
    others = [s for s in (op.outer, op.k, *op.batch) if s != 1] + [contiguous_extent]
    return next((v for v in (8, 4, 2) if all(s % v == 0 for s in others)), 1)


class _GemmGen:
    def __init__(self, c: Contraction, g: GemmConfig) -> None:
        self.c, self.g = c, g
        program = c.program
        compute = compute_dtype(program)
        self.ctype = "double" if compute == DType.FLOAT64 else "float"
        self.sig = signature(program, compute)
        self.buffers = {n: replace(b, dtype=compute) if b.kind == BufferKind.TEMP else b
                        for n, b in program.buffers.items()}
        self.helpers: list[str] = []
        self.lines: list[str] = []
        self.bodies: list[tuple[Launch, str]] = []  # finished kernels: their launch and body
        if g.split > 1:
            name = f"b{len(self.sig.args)}"
            scratch = Buffer(name, (g.split * self.elements,), compute.value, "scratch")
            self.sig = Signature({**self.sig.names, PARTIALS: name}, (*self.sig.args, scratch), self.sig.consts)

    def name(self, buffer: str) -> str:
        return self.sig.names[buffer]

    def line(self, text: str) -> None:
        self.lines.append("  " + text)

    def printer(self) -> EpiloguePrinter:
        return EpiloguePrinter(self.buffers, self.sig.names, self.ctype, "k_h2f({0})", "k_f2h((float)({0}))")

    def kernel(self) -> Kernel:
        head = [CUDA_HEAD, prelude(self.ctype, "__device__ static inline")]
        head += cuda_consts(self.sig, self.buffers, self.ctype)
        sig, g = self.sig, self.g
        launches: list[Launch] = []
        if g.path in ("mma", "simt"):
            if g.path == "mma":
                self.mma()
            else:
                self.simt()
            grid = (self.tiles_m * self.tiles_n, 1, math.prod(self.c.batch) * g.split)
            shared = g.shared_bytes(self.c) if g.path == "mma" else 0
            launches.append(self.finish(Launch("tb_gemm", sig.args, grid, (g.threads, 1, 1), shared)))
            if g.split > 1:
                blocks = self.rest(0, False, self.name(PARTIALS), compute_dtype(self.c.program), g.split)
                launches.append(self.finish(Launch("tb_gemm_sum", sig.args, (blocks, 1, 1), (EPILOGUE_THREADS, 1, 1))))
        else:
            plan = vendor_plan(self.c, fold=g.path == "cublaslt")
            if plan is None:
                raise ScheduleError(f"gemm({g.path}): the library cannot take these operand types")
            launches.append(self.vendor(plan))
            # the epilogue kernel keeps intermediate values in registers: no scratch but the library's output
            sig = replace(sig, args=tuple(a for a in sig.args if a.kind != "scratch" or a.name == self.name(plan.out)))
            written = plan.folded > 0 or self.c.program.nests[0].statement.epilogue is None
            if not written or plan.folded < len(self.c.program.nests) - 1:
                blocks = self.rest(plan.folded, written, self.name(plan.out), plan.dtype)
                launches.append(self.finish(Launch("tb_gemm", sig.args, (blocks, 1, 1), (EPILOGUE_THREADS, 1, 1))))
        params = cuda_params(sig, self.buffers, self.ctype)
        bodies = [f'extern "C" __global__ void __launch_bounds__({launch.block[0]}) {launch.entry}({params}) {{\n'
                  f"{body}\n}}\n" for launch, body in self.bodies]
        return Kernel("cuda", "\n".join(head + self.helpers) + "\n" + "".join(bodies), tuple(launches))

    def finish(self, launch: Launch) -> Launch:
        """Close the kernel emitted into ``lines`` as ``launch``'s entry."""
        self.bodies.append((launch, "\n".join(self.lines)))
        self.lines = []
        return launch

    @property
    def elements(self) -> int:
        """Elements of the output domain: batches x m x n."""
        return math.prod(self.c.batch) * self.c.m * self.c.n

    @property
    def tiles_m(self) -> int:
        return -(-self.c.m // self.g.tile_m) if self.g.tile_m else 1

    @property
    def tiles_n(self) -> int:
        return -(-self.c.n // self.g.tile_n) if self.g.tile_n else 1

    # -- shared pieces ----------------------------------------------------------------------

    def block_origin(self) -> None:
        """Bind ``m0``, ``n0`` (grouped rasterisation), the batch digits ``z<i>`` and operand base pointers; under
        split-K also the part ``k_split``, its first k tile ``kt0`` and its tile count ``nkt``."""
        g, c = self.g, self.c
        width = g.swizzle * self.tiles_n
        self.line("const int pid = blockIdx.x;")
        self.line(f"const int first = pid / {width} * {g.swizzle};")
        self.line(f"const int gsz = min({self.tiles_m} - first, {g.swizzle});")
        self.line(f"const idx_t m0 = (idx_t)(first + pid % {width} % gsz) * {g.tile_m};")
        self.line(f"const idx_t n0 = (idx_t)(pid % {width} / gsz) * {g.tile_n};")
        if g.split == 1:
            self.batch_digits("(idx_t)blockIdx.z")
        else:
            part = g.k_part(c)
            self.line(f"const int k_split = blockIdx.z % {g.split}, kt0 = k_split * {part};")
            self.line(f"const int nkt = min({part}, {g.k_tiles(c)} - kt0);")
            self.line(f"const idx_t zb = (idx_t)blockIdx.z / {g.split};")
            self.batch_digits("zb")
        for label, op in (("A", c.a), ("B", c.b)):
            offset = " + ".join(f"z{i} * {s}LL" for i, s in enumerate(op.batch) if s) or "0"
            ctype = STORAGE_C[self.buffers[op.buffer].dtype]
            self.line(f"const {ctype}* __restrict__ {label} = {self.name(op.buffer)} + {offset};")

    def batch_digits(self, flat: str) -> None:
        rest = flat
        for i, extent in reversed(list(enumerate(self.c.batch))):
            self.line(f"const idx_t z{i} = {rest} % {extent};")
            rest = f"({rest} / {extent})"

    def epilogue(self) -> None:
        """Define ``k_epi(row, col, acc)``: the matmul's epilogue and every later nest for one element; under
        split-K, the store of the part's sum to the scratch (the second kernel applies the epilogue)."""
        self.line(f"auto k_epi = [&](idx_t row, idx_t col, {self.ctype} acc) {{")
        if self.g.split == 1:
            for text in self.nests(0, False, _store):
                self.line("  " + text)
        else:
            c = self.c
            at = f"(k_split * {math.prod(c.batch)} + zb) * {c.m * c.n} + row * {c.n} + col"
            self.line(f"  {self.name(PARTIALS)}[{at}] = acc;")
        self.line("};")

    def k_tile(self, index: str) -> str:
        """The k tile of the part's tile ``index`` (k tiles are numbered from the part's first under split-K)."""
        return f"(idx_t){index}" if self.g.split == 1 else f"(idx_t)(kt0 + {index})"

    @property
    def k_count(self) -> str:
        """The k tiles this block walks: all, or its split-K part's ``nkt``."""
        return str(self.g.k_tiles(self.c)) if self.g.split == 1 else "nkt"

    def nests(self, first: int, written: bool, store: Store) -> list[str]:
        """Lines computing ``v<k>`` for nest ``first`` (from ``acc``: the raw product when ``first`` is 0, else that
        nest's value) and every later nest, storing each output through ``store`` unless ``written`` says nest
        ``first``'s output holds its value already."""
        c = self.c
        p = self.printer()
        coords = [f"z{i}" for i in range(len(c.batch))] + ["row", "col"]
        lines = []
        for k, nest in enumerate(c.program.nests[first:], start=first):
            st = nest.statement
            env = {d.name: coords[i] for i, d in enumerate(nest.parallel)}
            ext = extents(nest)
            if k == first:
                value = "acc" if k > 0 or st.epilogue is None else p.expr(st.epilogue, env, ext, "acc")
            else:
                value = p.expr(st.body, env, ext)
            lines.append(f"const {self.ctype} v{k} = {value};")
            if self.buffers[st.write.tensor].kind == BufferKind.OUTPUT and not (k == first and written):
                lines.append(store(p, st.write, env, ext, f"v{k}"))
            p.local[st.write.tensor] = f"v{k}"
        return lines

    def load_as(self, dtype: DType, ref: str) -> str:
        if dtype == DType.FLOAT16:
            return f"k_h2f({ref})"
        if dtype == DType.BFLOAT16:
            return f"k_bf2f({ref})"
        return f"({self.ctype})({ref})"

    # -- tensor cores -----------------------------------------------------------------------

    def mma(self) -> None:
        g, c = self.g, self.c
        tm, tn, tk, stages = g.tile_m, g.tile_n, g.tile_k, g.stages
        wm, wn = g.warp_grid()
        wtm, wtn = tm // wm, tn // wn
        mi, ni = wtm // 16, wtn // 8
        lda = tk + PAD
        b_rows, b_cols = (tn, tk) if c.b_k_major else (tk, tn)
        ldb = b_cols + PAD
        a_stage, b_stage = tm * lda, b_rows * ldb
        self.helpers.append(_PTX_HELPERS.replace("ELEM", "bf16" if c.a.dtype == DType.BFLOAT16 else "f16"))
        self.line("extern __shared__ __align__(16) unsigned char k_shared[];")
        self.line("HALF* sa = (HALF*)k_shared;")
        self.line(f"HALF* sb = sa + {stages * a_stage};")
        self.line("const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;")
        self.line(f"const int wm = warp / {wn}, wn = warp % {wn};")
        self.block_origin()
        self.line(f"float acc[{mi}][{ni}][4];")
        self.line(_unrolled(("i", mi), ("j", ni), ("e", 4)) + " acc[i][j][e] = 0.f;")
        # tile loaders: A rows m / cols k; B rows n / cols k (k-major) or rows k / cols n
        self.line("auto load = [&](int stage, idx_t k0) {")
        self.copy_tile("A", "sa", a_stage, lda, tm, tk, ("m0", c.m, c.a.outer), ("k0", c.k), _vector(c.a, c.k))
        if c.b_k_major:
            self.copy_tile("B", "sb", b_stage, ldb, tn, tk, ("n0", c.n, c.b.outer), ("k0", c.k), _vector(c.b, c.k))
        else:
            self.copy_tile("B", "sb", b_stage, ldb, tk, tn, ("k0", c.k, c.b.k), ("n0", c.n), _vector(c.b, c.n))
        self.line("};")
        # per-lane shared-memory byte offsets of the ldmatrix rows
        self.line("const unsigned sa0 = k_smem(sa), sb0 = k_smem(sb);")
        self.line(f"const unsigned a_lane = 2 * ((wm * {wtm} + (lane & 15)) * {lda} + (lane >> 4) * 8);")
        if c.b_k_major:
            self.line(f"const unsigned b_lane = 2 * ((wn * {wtn} + (lane >> 4) * 8 + (lane & 7)) * {ldb}"
                      " + ((lane >> 3) & 1) * 8);")
        else:
            self.line(f"const unsigned b_lane = 2 * ((((lane >> 3) & 1) * 8 + (lane & 7)) * {ldb}"
                      f" + wn * {wtn} + (lane >> 4) * 8);")
        b_step_n, b_step_k = (16 * ldb, 1) if c.b_k_major else (16, ldb)
        ldm_b = "k_ldm4" if c.b_k_major else "k_ldm4t"
        kt = self.k_count
        first_tiles = f" {{ if (s < {kt}) load(s, {self.k_tile('s')} * {tk}); k_commit(); }}"
        self.line(_unrolled(("s", stages - 1)) + first_tiles)
        self.line(f"for (int kt = 0; kt < {kt}; kt++) {{")
        self.line(f"  k_wait<{stages - 2}>();")
        self.line("  __syncthreads();")
        self.line(f"  const int next = kt + {stages - 1};")
        self.line(f"  if (next < {kt}) load(next % {stages}, {self.k_tile('next')} * {tk});")
        self.line("  k_commit();")
        self.line(f"  const int stage = kt % {stages};")
        self.line(f"  const unsigned as = sa0 + stage * {2 * a_stage} + a_lane;")
        self.line(f"  const unsigned bs = sb0 + stage * {2 * b_stage} + b_lane;")
        self.line(f"  #pragma unroll\n  for (int kk = 0; kk < {tk}; kk += 16) {{")
        self.line(f"    unsigned af[{mi}][4], bf[{ni}][2];")
        self.line("  " + _unrolled(("i", mi)) + f" k_ldm4(af[i], as + 2 * (i * 16 * {lda} + kk));")
        b_at = f"bs + 2 * (j * {b_step_n} + kk * {b_step_k})"
        self.line("  " + _unrolled(("j", ni // 2)) + f" {ldm_b}(&bf[2 * j][0], {b_at});")
        self.line("  " + _unrolled(("i", mi), ("j", ni)) + " k_mma(acc[i][j], af[i], bf[j]);")
        self.line("  }")
        self.line("}")
        self.epilogue()
        self.line(_unrolled(("i", mi), ("j", ni), ("h", 2)) + " {")
        self.line(f"  const idx_t row = m0 + wm * {wtm} + i * 16 + (lane >> 2) + h * 8;")
        self.line(f"  const idx_t col = n0 + wn * {wtn} + j * 8 + (lane & 3) * 2;")
        self.line(f"  if (row < {c.m}) {{")
        self.line(f"    if (col < {c.n}) k_epi(row, col, acc[i][j][2 * h]);")
        self.line(f"    if (col + 1 < {c.n}) k_epi(row, col + 1, acc[i][j][2 * h + 1]);")
        self.line("  }")
        self.line("}")

    def copy_tile(self, src: str, dst: str, stage_elems: int, ld: int, rows: int, cols: int,
                  row: tuple[str, int, int], col: tuple[str, int], vec: int) -> None:
        """Emit the copy of one ``rows x cols`` tile (cols contiguous in memory) into stage ``stage``."""
        (r0, r_ext, r_stride), (c0, c_ext) = row, col
        chunks = rows * cols // vec
        self.line(f"  #pragma unroll\n  for (int c = threadIdx.x; c < {chunks}; c += {self.g.threads}) {{")
        self.line(f"    const int r = c / {cols // vec}, q = c % {cols // vec} * {vec};")
        self.line(f"    const idx_t gr = {r0} + r, gc = {c0} + q;")
        self.line(f"    const bool ok = gr < {r_ext} && gc < {c_ext};")
        self.line(f"    const HALF* p = {src} + (ok ? gr * {r_stride}LL + gc : 0);")
        self.line(f"    HALF* d = {dst} + stage * {stage_elems} + r * {ld} + q;")
        if vec == 1:
            self.line("    *d = ok ? *p : (HALF)0;")
        else:
            size = 2 * vec
            helper = _CP_ASYNC.format(n=size, cache="cg" if size == 16 else "ca")
            if helper not in self.helpers:
                self.helpers.append(helper)
            self.line(f"    k_cp{size}(k_smem(d), p, ok);")
        self.line("  }")

    # -- CUDA cores -------------------------------------------------------------------------

    def simt(self) -> None:
        g, c, t = self.g, self.c, self.ctype
        tm, tn, tk, threads = g.tile_m, g.tile_n, g.tile_k, g.threads
        rows, cols = g.thread_tile()
        ty_count, tx_count = tm // rows, tn // cols
        la, lb = tm * tk // threads, tn * tk // threads
        self.line(f"__shared__ {t} As[{tk}][{tm + 1}];")
        self.line(f"__shared__ {t} Bs[{tk}][{tn + 1}];")
        self.line(f"const int tid = threadIdx.x, tx = tid % {tx_count}, ty = tid / {tx_count};")
        self.block_origin()
        self.line(f"{t} acc[{rows}][{cols}];")
        self.line(_unrolled(("i", rows), ("j", cols)) + " acc[i][j] = 0;")
        self.line(f"{t} ra[{la}], rb[{lb}];")
        # where each thread's loaded elements go: (global row, global col) and shared slot, per operand
        a_at = ("r = e / {tk}", "q = e % {tk}")
        self.line("auto fetch = [&](idx_t k0) {")
        self.fetch("ra", la, "A", c.a.dtype, a_at, ("m0 + r", c.m, c.a.outer), ("k0 + q", c.k, 1))
        if c.b_k_major:
            self.fetch("rb", lb, "B", c.b.dtype, a_at, ("n0 + r", c.n, c.b.outer), ("k0 + q", c.k, 1))
        else:
            self.fetch("rb", lb, "B", c.b.dtype, ("r = e / {tn}", "q = e % {tn}"), ("k0 + r", c.k, c.b.k),
                       ("n0 + q", c.n, 1))
        self.line("};")
        self.line("auto stash = [&]() {")
        self.stash("ra", la, "As[q][r]", ("r = e / {tk}", "q = e % {tk}"))
        if c.b_k_major:
            self.stash("rb", lb, "Bs[q][r]", ("r = e / {tk}", "q = e % {tk}"))
        else:
            self.stash("rb", lb, "Bs[r][q]", ("r = e / {tn}", "q = e % {tn}"))
        self.line("};")
        kt = self.k_count
        self.line(f"fetch({'0' if g.split == 1 else f'(idx_t)kt0 * {tk}'}); stash(); __syncthreads();")
        self.line(f"for (int kt = 0; kt < {kt}; kt++) {{")
        self.line(f"  if (kt + 1 < {kt}) fetch({self.k_tile('(kt + 1)')} * {tk});")
        self.line(f"  {t} part[{rows}][{cols}];  // per-tile partial sums: error grows with k / tile_k, not k")
        self.line("  " + _unrolled(("i", rows), ("j", cols)) + " part[i][j] = 0;")
        self.line(f"  #pragma unroll\n  for (int kk = 0; kk < {tk}; kk++) {{")
        self.line(f"    {t} a[{rows}], b[{cols}];")
        self.line("  " + _unrolled(("i", rows)) + f" a[i] = As[kk][ty + i * {ty_count}];")
        self.line("  " + _unrolled(("j", cols)) + f" b[j] = Bs[kk][tx + j * {tx_count}];")
        self.line("  " + _unrolled(("i", rows), ("j", cols)) + " part[i][j] += a[i] * b[j];")
        self.line("  }")
        self.line("  " + _unrolled(("i", rows), ("j", cols)) + " acc[i][j] += part[i][j];")
        self.line("  __syncthreads();")
        self.line(f"  if (kt + 1 < {kt}) {{ stash(); __syncthreads(); }}")
        self.line("}")
        self.epilogue()
        self.line(_unrolled(("i", rows), ("j", cols)) + " {")
        self.line(f"  const idx_t row = m0 + ty + i * {ty_count}, col = n0 + tx + j * {tx_count};")
        self.line(f"  if (row < {c.m} && col < {c.n}) k_epi(row, col, acc[i][j]);")
        self.line("}")

    def fetch(self, regs: str, count: int, src: str, dtype: DType, at: tuple[str, str],
              row: tuple[str, int, int], col: tuple[str, int, int]) -> None:
        g = self.g
        fmt = {"tk": g.tile_k, "tn": g.tile_n}
        self.line(f"  #pragma unroll\n  for (int l = 0; l < {count}; l++) {{")
        self.line(f"    const int e = threadIdx.x + l * {g.threads}, {at[0].format(**fmt)}, {at[1].format(**fmt)};")
        self.line(f"    const idx_t gr = {row[0]}, gc = {col[0]};")
        ref = f"{src}[gr * {row[2]}LL + gc * {col[2]}LL]"
        self.line(f"    {regs}[l] = (gr < {row[1]} && gc < {col[1]}) ? {self.load_as(dtype, ref)} : ({self.ctype})0;")
        self.line("  }")

    def stash(self, regs: str, count: int, slot: str, at: tuple[str, str]) -> None:
        fmt = {"tk": self.g.tile_k, "tn": self.g.tile_n}
        self.line(f"  #pragma unroll\n  for (int l = 0; l < {count}; l++) {{")
        self.line(f"    const int e = threadIdx.x + l * {self.g.threads};")
        self.line(f"    const int {at[0].format(**fmt)}, {at[1].format(**fmt)};")
        self.line(f"    {slot} = {regs}[l];")
        self.line("  }")

    # -- vendor -----------------------------------------------------------------------------

    def vendor(self, plan: VendorPlan) -> Launch:
        """The library launch computing the product (and ``plan``'s folded epilogue) into ``plan.out``: row-major
        ``C = A B`` as column-major ``C^T = B^T A^T``, so the library's A is our B; stacked batches
        (``Contraction.stacked_rows``) as one product of all their rows, unless the config is ``batched``."""
        c, g = self.c, self.g
        arg = {a.name: a for a in self.sig.args}
        stacked = c.stacked_rows and not g.batched
        rows, batch = (math.prod(c.batch) * c.m, 1) if stacked else (c.m, math.prod(c.batch))
        scalars = {
            "trans_a": int(c.b_k_major), "m": c.n, "n": rows, "k": c.k,
            "lda": c.b.outer if c.b_k_major else c.b.k, "ldb": c.a.outer if c.a_k_major else c.a.k, "ldc": c.n,
            "stride_a": _flat_stride(c.b, c.batch), "stride_b": _flat_stride(c.a, c.batch), "stride_c": rows * c.n,
            "batch": batch, "type_a": _CUDA_TYPE[c.b.dtype], "type_b": _CUDA_TYPE[c.a.dtype],
            "type_c": _CUDA_TYPE[plan.dtype], "compute": _COMPUTE_64F if c.a.dtype == DType.FLOAT64 else _COMPUTE_32F,
        }
        if not c.a_k_major:  # A read transposed (only then: the launches of k-major A stay as they were)
            scalars["trans_b"] = 1
        buffers = [arg[self.name(c.b.buffer)], arg[self.name(c.a.buffer)], arg[self.name(plan.out)]]
        entry = "cublas_gemm"
        if g.path == "cublaslt":
            entry = "cublaslt_matmul"
            scalars |= {"epilogue": plan.epilogue, "bias": int(plan.bias is not None), "algo": g.algo}
            buffers += [arg[self.name(plan.bias)]] if plan.bias else []
        return Launch(entry, (*buffers, *(Scalar(k, v, "int64") for k, v in scalars.items())), library=entry)

    def rest(self, first: int, written: bool, source: str, dtype: DType, parts: int = 1) -> int:
        """Emit the kernel applying epilogue nests ``first``.. to the values in ``source`` (of ``dtype``; the sum of
        its ``parts`` consecutive slices of the output domain's size, in order); ``written``: nest ``first``'s
        output holds them already. Returns its grid size. A thread takes ``width`` consecutive elements of a row
        (:data:`VECTOR_BYTES` of the narrowest of ``source`` and the outputs it stores; one or two vector loads or
        stores each) where the row length and the dtypes allow, else one element."""
        c = self.c
        later = [n for n in c.program.nests[first + int(written):]
                 if self.buffers[n.statement.write.tensor].kind == BufferKind.OUTPUT]
        outputs = [n.statement.write.tensor for n in later]
        sizes = {dtype.itemsize} | {self.buffers[b].dtype.itemsize for b in outputs}
        fits = [w for w in (8, 4, 2) if w * min(sizes) <= VECTOR_BYTES and w * min(sizes) % 4 == 0 and c.n % w == 0]
        in_order = all(row_major_store(c.program, n) for n in later)  # a transposed store goes element by element
        width = fits[0] if fits and sizes <= {2, 4} and in_order else 1
        total = self.elements
        self.line(f"const idx_t e = ((idx_t)blockIdx.x * {EPILOGUE_THREADS} + threadIdx.x) * {width};")
        self.line(f"if (e >= {total}) return;")
        self.line(f"const idx_t row = e / {c.n} % {c.m};")
        self.batch_digits(f"(e / {c.m * c.n})")
        slices = [f"{source} + {p * total}LL" if p else source for p in range(parts)]
        if width == 1:
            self.line(f"const idx_t col = e % {c.n};")
            value = " + ".join(self.load_as(dtype, f"({at})[e]" if p else f"{at}[e]") for p, at in enumerate(slices))
            self.line(f"const {self.ctype} acc = {value};")
            for text in self.nests(first, written, _store):
                self.line(text)
            return -(-total // EPILOGUE_THREADS)
        self.helpers.append(_VECTOR_IO)
        words = width * dtype.itemsize // 4
        loaded = [f"d{p}" if parts > 1 else "d" for p in range(parts)]
        for at, d in zip(slices, loaded, strict=True):
            self.line(f"unsigned {d}[{words}];")
            self.line(_vector_io("ld", at, d, words))
        for b in outputs:
            self.line(f"float o_{self.name(b)}[{width}];")

        def keep(p: EpiloguePrinter, access: Access, env: Env, ext: Mapping[str, int], value: str) -> str:
            return f"o_{self.name(access.tensor)}[i] = {value};"

        self.line(_unrolled(("i", width)) + " {")
        self.line(f"  const idx_t col = e % {c.n} + i;")
        self.line(f"  const {self.ctype} acc = {' + '.join(_unpack(dtype, d) for d in loaded)};")
        for text in self.nests(first, written, keep):
            self.line("  " + text)
        self.line("}")
        for b in outputs:
            dtype, name = self.buffers[b].dtype, self.name(b)
            count = width * dtype.itemsize // 4
            self.line(f"unsigned w_{name}[{count}];")
            self.line(_unrolled(("i", count)) + f" w_{name}[i] = {_pack(dtype, f'o_{name}')};")
            self.line(_vector_io("st", name, f"w_{name}", count))
        return -(-total // (width * EPILOGUE_THREADS))


Store = Callable[[EpiloguePrinter, Access, Env, Mapping[str, int], str], str]


def _vector_io(op: str, buffer: str, words: str, count: int) -> str:
    """Load (``op`` "ld") or store ("st") the ``count`` 32-bit ``words`` at element ``e`` of ``buffer``, 16, 8 or 4
    bytes at a time."""
    out, done = [], 0
    for size in (4, 2, 1):
        while count - done >= size:
            at = f"({'const ' if op == 'ld' else ''}char*)({buffer} + e)" + (f" + {4 * done}" if done else "")
            part = f"{words} + {done}" if done else words
            out.append(f"k_ld{size}({part}, {at});" if op == "ld" else f"k_st{size}({at}, {part});")
            done += size
    return " ".join(out)


def _store(p: EpiloguePrinter, access: Access, env: Env, ext: Mapping[str, int], value: str) -> str:
    return p.store(access, env, ext, value)


def _unpack(dtype: DType, words: str) -> str:
    """Element ``i`` of the packed ``words`` as a float."""
    if dtype == DType.FLOAT32:
        return f"__uint_as_float({words}[i])"
    half = f"(unsigned short)({words}[i / 2] >> (i % 2 * 16))"
    return f"k_h2f({half})" if dtype == DType.FLOAT16 else f"k_bf2f({half})"


def _pack(dtype: DType, values: str) -> str:
    """32-bit word ``i`` of the float array ``values`` stored as ``dtype`` (two 16-bit halves: one conversion)."""
    if dtype == DType.FLOAT32:
        return f"__float_as_uint({values}[i])"
    return f"k_{'f16x2' if dtype == DType.FLOAT16 else 'bf16x2'}({values}[2 * i], {values}[2 * i + 1])"


def _unrolled(*loops: tuple[str, int]) -> str:
    """Headers of nested fully unrolled loops ``for (int v = 0; v < n; v++)``, one per ``(v, n)``."""
    return " ".join(f"\n  #pragma unroll\n  for (int {v} = 0; {v} < {n}; {v}++)" for v, n in loops).lstrip("\n ")


def _flat_stride(op: Operand, batch: tuple[int, ...]) -> int:
    """The one element stride between consecutive flattened batches of ``op`` (ScheduleError when none)."""
    if not batch:
        return 0
    for i in range(len(batch) - 1):
        if op.batch[i] != op.batch[i + 1] * batch[i + 1]:
            raise ScheduleError("gemm(cublas): the batch dims of an operand do not flatten to one stride")
    return op.batch[-1]

