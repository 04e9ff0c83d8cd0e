"""CUDA for a CSR product under ``sparse(merge,C[,V])``: SpMM balanced by nonzeros instead of rows.

A *sparse product* (:func:`match_sparse_product`) is a program whose first nest is the CSR row reduction
``acc[i, j] = sum over r in [ptr[i], ptr[i + 1]) of body(r, j)`` (spmm's lowering) and whose later nests are
pointwise over its ``[rows, cols]`` domain (bias, activation: the epilogue). A row-per-lane-group kernel
(``sparse(csr)``) serialises a hub row of a skewed graph on one group; here the nonzeros are cut into chunks of ``C``
and each chunk goes to a group of ``G`` lanes covering ``G * V`` columns (the lanes stride over them, ``V`` columns
each; wider outputs get several such column tiles per chunk), so every group does the same work whatever the
degrees. Three launches:

1. ``tb_spmm_zero``: zero the accumulator rows that a chunk boundary cuts (without an epilogue, empty rows too).
2. ``tb_spmm``: each group finds its chunk's first row by a G-ary search over ``ptr`` (one probe per lane and a
   ballot per step), then walks the chunk, loading the dense values of :data:`IN_FLIGHT` / V nonzeros before adding
   them up; at each row end the row's sums go out: a row wholly inside the chunk through the epilogue straight to
   the outputs, a cut row by ``atomicAdd`` into the accumulator (its sum is then reassociated across chunks).
3. ``tb_spmm_finish`` (only with an epilogue): the epilogue of the cut and the empty rows.

A row is *cut* when its first and last nonzero lie in different chunks; launches 1-3 all use that one test. The
accumulator is the first nest's write buffer and must hold the compute type (a temporary, or a float32 / float64
output), since ``atomicAdd`` adds into it.
"""

from __future__ import annotations

from dataclasses import dataclass

from embed.loopnest import Affine, BufferKind, Combiner, Indirect, Load, LoopNest, LoopProgram, walk
from transforms.codegen.cuda import CUDA_HEAD
from transforms.codegen.cuda_gemm import EpiloguePrinter
from transforms.codegen.expr import extents, prelude
from transforms.codegen.kernel import Kernel, codegen_context, compute_dtype, cuda_consts, cuda_params
from transforms.contraction import epilogue_ok
from transforms.run import Launch
from transforms.schedule import Schedule, ScheduleError

IN_FLIGHT = 16  # dense values each lane loads before it adds them: IN_FLIGHT // V nonzeros at a time
DEFAULT_THREADS = 256
ROW_THREADS = 256  # the zero and finish kernels: one thread per row, a warp per flagged row


@dataclass(frozen=True)
class SparseProduct:
    """A CSR product (see the module docstring): its reduction nest, where a row's nonzeros start (``ptr[row]``),
    the dim names of rows, columns and nonzeros, and ``nnz``, the length of an array indexed by the nonzero (so at
    least the number of nonzeros)."""

    program: LoopProgram
    nest: LoopNest
    start: Affine
    row: str
    col: str
    nonzero: str
    rows: int
    cols: int
    nnz: int

    @property
    def accumulator(self) -> str:
        return self.nest.statement.write.tensor

    @property
    def has_epilogue(self) -> bool:
        """Whether the outputs need more than the sums themselves (then launch 3 finishes cut and empty rows)."""
        return len(self.program.nests) > 1 or self.nest.statement.epilogue is not None


def match_sparse_product(program: LoopProgram) -> SparseProduct | None:
    """The sparse product ``program`` is, or None."""
    if not program.nests:
        return None
    nest = program.nests[0]
    st, par, red = nest.statement, nest.parallel, nest.reduction
    if st.combiner != Combiner.SUM or len(par) != 2 or len(red) != 1 or red[0].ragged is None:
        return None
    row, col, nonzero = par[0].name, par[1].name, red[0].name
    start, stop = red[0].ragged.start, red[0].ragged.stop
    ptr = start.terms[0][0] if len(start.terms) == 1 else None
    if not isinstance(ptr, Indirect) or start != Affine.of(Indirect(ptr.tensor, (Affine.of(row),))):
        return None  # the row range must be [ptr[row], ptr[row + 1])
    buffers = program.buffers
    body_reads = [n.access for n in walk(st.body) if isinstance(n, Load)]
    if (stop != Affine.of(Indirect(ptr.tensor, (Affine.of(row) + 1,)))
            or buffers[ptr.tensor].shape != (par[0].extent + 1,) or any(row in a.dims() for a in body_reads)
            or st.write.fill is not None or st.write.index != (Affine.of(row), Affine.of(col))):
        return None
    acc = buffers[st.write.tensor]
    if acc.kind != BufferKind.TEMP and acc.dtype != compute_dtype(program):
        return None
    lengths = [buffers[a.tensor].shape[0] for a in st.loads()
               if a.index == (Affine.of(nonzero),) and len(buffers[a.tensor].shape) == 1]
    if not lengths or not epilogue_ok(program, nest):
        return None
    return SparseProduct(program, nest, start, row, col, nonzero, par[0].extent, par[1].extent, min(lengths))


def generate_spmm(schedule: Schedule) -> Kernel:
    """The launches running ``schedule``'s sparse product under ``sparse(merge,C,V)`` (see the module docstring)."""
    product = match_sparse_product(schedule.program)
    if product is None or schedule.sparse[0] != "merge" or schedule.chunk < 1:
        raise ScheduleError("sparse(merge): the program is not a CSR product (spmm) with a pointwise epilogue whose "
                            "sums are held in float32 / float64; use sparse(csr) or sparse(ell)")
    return _MergeGen(product, schedule.chunk, schedule.sparse[1], schedule.threads or DEFAULT_THREADS).kernel()


class _MergeGen:
    def __init__(self, product: SparseProduct, chunk: int, width: int, threads: int) -> None:
        self.m, self.chunk, self.width, self.threads = product, chunk, width, threads
        context = codegen_context(product.program)
        self.ctype, self.sig, self.buffers = context.ctype, context.sig, context.buffers
        lanes = -(-product.cols // width)
        self.group = min(32, max(2, 1 << (lanes - 1).bit_length()))  # G: lanes per chunk, a power of two
        self.tiles = -(-product.cols // (self.group * width))  # column tiles per chunk
        self.acc = self.sig.names[product.accumulator]
        self.lines: list[str] = []

    def line(self, text: str) -> None:
        self.lines.append("  " + text)

    def printer(self) -> EpiloguePrinter:
        return EpiloguePrinter(self.buffers, self.sig.names, self.ctype, "k_h2f({0})", "k_f2h((float)({0}))")

    def ptr(self, i: str) -> str:
        """Where row ``i``'s nonzeros start (``i`` = rows: where the last row ends)."""
        return self.printer().index(self.m.start, {self.m.row: i}, {})

    def kernel(self) -> Kernel:
        params = cuda_params(self.sig, self.buffers, self.ctype)
        head = [CUDA_HEAD, prelude(self.ctype, "__device__ static inline"),
                f"__device__ static inline void k_add({self.ctype}* p, {self.ctype} v) {{ atomicAdd(p, v); }}"]
        head += cuda_consts(self.sig, self.buffers, self.ctype)
        row_grid = max(1, -(-self.m.rows // ROW_THREADS))
        workers = max(1, -(-self.m.nnz // self.chunk)) * self.tiles
        kernels = [("tb_spmm_zero", self.zero, row_grid, ROW_THREADS),
                   ("tb_spmm", self.merge, -(-workers * self.group // self.threads), self.threads)]
        if self.m.has_epilogue:
            kernels.append(("tb_spmm_finish", self.finish, row_grid, ROW_THREADS))
        bodies, launches = [], []
        for entry, emit, grid, block in kernels:
            self.lines = []
            emit()
            bodies.append(f'extern "C" __global__ void __launch_bounds__({block}) {entry}({params}) {{\n'
                          + "\n".join(self.lines) + "\n}")
            launches.append(Launch(entry, self.sig.args, (grid, 1, 1), (block, 1, 1)))
        return Kernel("cuda", "\n".join(head) + "\n" + "\n\n".join(bodies) + "\n", tuple(launches))

    # -- launches 1 and 3: one thread per row ------------------------------------------------

    def flagged_rows(self, empty_too: bool, statement: str, tell_empty: bool = False) -> None:
        """Run ``statement`` on ``r``, ``c`` for every column of the rows cut by a chunk boundary, and of the empty
        rows when ``empty_too`` (``tell_empty``: ``e`` says whether row ``r`` is empty): a thread flags its row, the
        warp writes the flagged rows one after another."""
        rows, chunk = self.m.rows, self.chunk
        self.line(f"const idx_t row = (idx_t)blockIdx.x * {ROW_THREADS} + threadIdx.x;")
        self.line("const int lane = threadIdx.x % 32;")
        self.line(f"const idx_t first = {self.ptr('0')};")
        self.line(f"const idx_t lo = row < {rows} ? {self.ptr('row')} : 0;")
        self.line(f"const idx_t hi = row < {rows} ? {self.ptr('row + 1')} : 0;")
        self.line(f"const bool empty = row < {rows} && hi == lo;")
        self.line(f"const bool cut = hi > lo && (lo - first) / {chunk} != (hi - 1 - first) / {chunk};")
        self.line(f"unsigned todo = __ballot_sync(0xffffffffu, {'cut || empty' if empty_too else 'cut'});")
        self.line("while (todo) {")
        self.line("  const int src = __ffs(todo) - 1;")
        self.line("  todo &= todo - 1;")
        self.line("  const idx_t r = row - lane + src;")
        if tell_empty:
            self.line("  const bool e = __shfl_sync(0xffffffffu, (int)empty, src) != 0;")
        self.line(f"  for (idx_t c = lane; c < {self.m.cols}; c += 32) {statement}")
        self.line("}")

    def zero(self) -> None:
        self.flagged_rows(not self.m.has_epilogue, f"{self.acc}[r * {self.m.cols}LL + c] = ({self.ctype})0;")

    def finish(self) -> None:
        self.epilogue()
        self.flagged_rows(True, f"k_epi(r, c, e ? ({self.ctype})0 : {self.acc}[r * {self.m.cols}LL + c]);", True)

    def epilogue(self) -> None:
        """Define ``k_epi(er, ec, ea)``: the first nest's epilogue on the sum ``ea`` of element (er, ec), then every
        later nest, each value kept in a register and stored where it is an output."""
        p = self.printer()
        self.line(f"auto k_epi = [&](idx_t er, idx_t ec, {self.ctype} ea) {{")
        for k, nest in enumerate(self.m.program.nests):
            st, ext = nest.statement, extents(nest)
            env = {nest.parallel[0].name: "er", nest.parallel[1].name: "ec"}
            if k:
                value = p.expr(st.body, env, ext)
            else:
                value = "ea" if st.epilogue is None else p.expr(st.epilogue, env, ext, "ea")
            self.line(f"  const {self.ctype} v{k} = {value};")
            if self.buffers[st.write.tensor].kind == BufferKind.OUTPUT:
                self.line("  " + p.store(st.write, env, ext, f"v{k}"))
            p.local[st.write.tensor] = f"v{k}"
        self.line("};")

    # -- launch 2: one chunk of nonzeros per lane group --------------------------------------

    def merge(self) -> None:
        m, c, v, g, t = self.m, self.chunk, self.width, self.group, self.ctype
        ahead = max(1, IN_FLIGHT // v)
        self.line(f"const int gl = threadIdx.x % {g};")
        self.line(f"const idx_t worker = ((idx_t)blockIdx.x * {self.threads} + threadIdx.x) / {g};")
        self.line(f"const idx_t col0 = worker % {self.tiles} * {g * v} + gl;")
        self.line(f"const idx_t first = {self.ptr('0')}, total = {self.ptr(str(m.rows))};")
        self.line(f"const idx_t start = first + worker / {self.tiles} * {c};")
        self.line("if (start >= total) return;")
        self.line(f"const idx_t end = start + {c} < total ? start + {c} : total;")
        self.search()
        self.line(f"idx_t row = lo, row_lo = {self.ptr('row')}, row_hi = {self.ptr('row + 1')};")
        self.line(f"idx_t cc[{v}];  // this lane's columns, clamped for reads")
        self.line(f"{t} sum[{v}];")
        self.line("#pragma unroll")
        self.line(f"for (int v = 0; v < {v}; v++) {{")
        self.line(f"  cc[v] = col0 + v * {g} < {m.cols} ? col0 + v * {g} : {m.cols - 1};")
        self.line(f"  sum[v] = ({t})0;")
        self.line("}")
        self.epilogue()
        self.line("auto flush = [&]() {  // the row ends: a row inside the chunk is final, a cut one is added up")
        self.line(f"  const bool whole = (row_lo - first) / {c} == (row_hi - 1 - first) / {c};")
        self.line("  #pragma unroll")
        self.line(f"  for (int v = 0; v < {v}; v++) {{")
        self.line(f"    const idx_t col = col0 + v * {g};")
        self.line(f"    if (col < {m.cols}) {{")
        self.line("      if (whole) k_epi(row, col, sum[v]);")
        self.line(f"      else k_add(&{self.acc}[row * {m.cols}LL + col], sum[v]);")
        self.line("    }")
        self.line(f"    sum[v] = ({t})0;")
        self.line("  }")
        self.line("};")
        body = self.printer().expr(m.nest.statement.body, {m.nonzero: "k", m.col: "cc[v]"}, extents(m.nest))
        self.line(f"for (idx_t base = start; base < end; base += {ahead}) {{")
        self.line(f"  {t} d[{ahead}][{v}];")
        self.line("  #pragma unroll")
        self.line(f"  for (int u = 0; u < {ahead}; u++) {{  // loads first: {ahead} nonzeros in flight")
        self.line("    const idx_t k = base + u < end ? base + u : start;")
        self.line("    #pragma unroll")
        self.line(f"    for (int v = 0; v < {v}; v++) d[u][v] = {body};")
        self.line("  }")
        self.line("  #pragma unroll")
        self.line(f"  for (int u = 0; u < {ahead}; u++) {{")
        self.line("    if (base + u >= end) break;")
        self.line("    if (base + u >= row_hi) {")
        self.line("      flush();")
        self.line(f"      do {{ row++; row_lo = row_hi; row_hi = {self.ptr('row + 1')}; }} while (row_hi <= base + u);")
        self.line("    }")
        self.line("    #pragma unroll")
        self.line(f"    for (int v = 0; v < {v}; v++) sum[v] += d[u][v];")
        self.line("  }")
        self.line("}")
        self.line("flush();")

    def search(self) -> None:
        """Bind ``lo``: the last row whose nonzeros start at or before ``start`` (the row holding it), by a G-ary
        search: the group's G lanes probe G evenly spaced rows and a ballot keeps the last one not past ``start``."""
        g = self.group
        bits = "__ballot_sync(0xffffffffu, ok)"
        if g < 32:  # this group's bits of a ballot over its own lanes
            self.line(f"const int shift = threadIdx.x % 32 / {g} * {g};")
            bits = f"(__ballot_sync({hex((1 << g) - 1)}u << shift, ok) >> shift & {hex((1 << g) - 1)}u)"
        self.line(f"idx_t lo = 0, hi = {self.m.rows};")
        self.line("while (hi - lo > 1) {")
        self.line(f"  const idx_t step = (hi - lo + {g - 1}) / {g}, probe = lo + gl * step;")
        self.line(f"  const bool ok = probe < hi && {self.ptr('probe')} <= start;")
        self.line(f"  lo += (31 - __clz({bits})) * step;")
        self.line("  hi = hi < lo + step ? hi : lo + step;")
        self.line("}")
