"""GEMM-shaped programs and the GEMM kernel configurations that may run them (cuda ``gemm`` step).

A program is a *contraction* when its first nest is ``out[batch.., m, n] = sum_k a[.., m, k] * b[.., k, n]``
(or ``b[.., n, k]``: transpose_b) with a row-major write, and every later nest is pointwise over the same
output domain, reading what earlier nests wrote only at the same element: the epilogue (bias, activation,
residual, scale) can then run on the accumulators. Reshapes and transposes of what it computes (head splits,
flattening) are folded into the epilogue's store first (``transforms.views.fold_views``): a row-major write is
one at the element's row-major offset whatever the buffer's shape, and a folded view's nest may store through
any map. :func:`match_contraction` recognises one and records the operands' element strides;
:func:`gemm_configs` lists the legal :class:`GemmConfig` for it, and :func:`vendor_plan` says what a vendor GEMM
(cuBLAS, cuBLASLt) computes of it and where it writes.

    contraction = match_contraction(program)  # None when the program is not GEMM-shaped
    configs = gemm_configs(contraction)       # cuBLASLt first, tensor-core or SIMT tiles, cuBLAS
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import product

from embed.ir import DType
from embed.loopnest import (
    Access,
    BufferKind,
    Call,
    Combiner,
    Dim,
    Load,
    LoopNest,
    LoopProgram,
    walk,
    without_splits,
)
from transforms.views import VIEWS, fold_views, keeps_order, merge_inner_dims

PATHS = ("mma", "simt", "cublas", "cublaslt")
BATCHED = "batched"  # the last argument of a vendor path that runs stacked batches as a batch
VENDOR_PATHS = ("cublaslt", "cublas")  # a vendor GEMM, then our epilogue kernel
MMA_DTYPES = (DType.FLOAT16, DType.BFLOAT16)
VENDOR_DTYPES = (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64)  # operand types of the vendor paths
LT_ALGOS = 8  # cublaslt: ranks of the cuBLASLt heuristic's algorithms in the search space
#: cublasLtEpilogue_t by (bias added, activation): what cuBLASLt applies to the product before writing D.
LT_EPILOGUES = {(False, None): 1, (False, "relu"): 2, (True, None): 4, (True, "relu"): 6, (False, "gelu_tanh"): 32,
                (True, "gelu_tanh"): 36}
#: Dynamic shared memory a block may use (H100/H200 allow 227 KB per block after opting in).
MAX_SHARED_BYTES = 227 * 1024
PAD = 8  # elements of padding per shared-memory row: ldmatrix rows land on distinct banks
MAX_GRID_Z = 65535  # blocks along grid z: batches x split-K parts


@dataclass(frozen=True)
class Operand:
    """A matmul operand: buffer, dtype and element strides (per batch dim, of its m/n dim, of k)."""

    buffer: str
    dtype: DType
    batch: tuple[int, ...]
    outer: int
    k: int


@dataclass(frozen=True)
class Contraction:
    """A GEMM + pointwise epilogue program: extents, operands, and the nests after the matmul."""

    program: LoopProgram
    batch: tuple[int, ...]
    m: int
    n: int
    k: int
    a: Operand
    b: Operand

    @property
    def matmul(self) -> LoopNest:
        return self.program.nests[0]

    @property
    def epilogue(self) -> tuple[LoopNest, ...]:
        return self.program.nests[1:]

    @property
    def a_k_major(self) -> bool:
        """A holds k contiguously ([.., M, K]); else m is contiguous ([.., K, M] read transposed: a transpose folded
        into the loads), which only the vendor paths take (as a transposed operand)."""
        return self.a.k == 1

    @property
    def b_k_major(self) -> bool:
        """B holds k contiguously ([.., N, K], transpose_b); else n is contiguous ([.., K, N])."""
        return self.b.k == 1

    @property
    def tensor_cores(self) -> bool:
        return self.a.dtype == self.b.dtype and self.a.dtype in MMA_DTYPES

    @property
    def stacked_rows(self) -> bool:
        """The batches are one matrix of ``batch x m`` rows: B is the same for every batch (a weight) and A's rows
        run on from one batch into the next, as the output's do. A library then runs one GEMM, not a batch of short
        ones (as ``torch.matmul`` does): on an H200, ViT's fp32 MLP down projection as 8 batches of 196 rows took
        1.4 times as long as one product of 1568 rows (``bench/README.md``)."""
        if not self.batch or any(self.b.batch) or not self.a_k_major:
            return False
        strides = [*self.a.batch, self.a.outer]
        extents = [*self.batch, self.m]
        return all(strides[i] == extents[i + 1] * strides[i + 1] for i in range(len(self.batch)))


@dataclass(frozen=True)
class GemmConfig:
    """One way to run a contraction: ``mma`` (tensor cores, fp16/bf16), ``simt`` (register-blocked CUDA
    cores), ``cublas`` (cuBLAS's default GEMM, then one epilogue kernel) or ``cublaslt`` (the cuBLASLt
    algorithm of heuristic rank ``algo``, applying what it can of the epilogue, then one kernel for the rest;
    see :func:`vendor_plan`; stacked batches run as one product unless ``batched``). Block tile
    ``tile_m x tile_n`` stepping ``tile_k`` along k, ``warps`` per block, ``stages`` shared-memory buffers (cp.async
    pipeline depth; simt: 1), ``swizzle``: blocks are rasterised in groups of that many tile rows (L2 reuse of B),
    and ``split`` (split-K): the k tiles are cut into that many parts of at least :data:`MIN_SPLIT_TILES` tiles, each
    a block of its own writing partial sums, and a second kernel adds them and applies the epilogue (more blocks
    where the output has few tiles and k is long)."""

    path: str
    tile_m: int = 0
    tile_n: int = 0
    tile_k: int = 0
    warps: int = 0
    stages: int = 0
    swizzle: int = 1
    algo: int = 0
    split: int = 1
    batched: bool = False  # vendor paths: stacked batches (``Contraction.stacked_rows``) run as a batch all the same

    @property
    def args(self) -> tuple[str | int, ...]:
        batched = (BATCHED,) if self.batched else ()
        if self.path == "cublas":
            return (self.path, *batched)
        if self.path == "cublaslt":
            return (self.path, self.algo, *batched)
        tiles = (self.path, self.tile_m, self.tile_n, self.tile_k, self.warps, self.stages, self.swizzle)
        return (*tiles, self.split) if self.split > 1 else tiles  # recipes stored before split-K stay valid

    def split_legal(self, c: Contraction) -> bool:
        """``split`` is 1, or an offered split-K cutting the k tiles into that many parts of at least
        :data:`MIN_SPLIT_TILES` (none empty) whose blocks fit grid z beside the batches. The tile is not checked."""
        return self.split == 1 or (self.split in SPLIT_K and self.k_part(c) >= MIN_SPLIT_TILES
                                   and -(-self.k_tiles(c) // self.k_part(c)) == self.split
                                   and math.prod(c.batch) * self.split <= MAX_GRID_Z)

    def k_tiles(self, c: Contraction) -> int:
        return -(-c.k // self.tile_k)

    def k_part(self, c: Contraction) -> int:
        """k tiles in each split-K part (the last may hold fewer)."""
        return -(-self.k_tiles(c) // self.split)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def warp_grid(self) -> tuple[int, int]:
        """(warps along m, warps along n) of an mma block."""
        wm = 2 if self.warps >= 2 else 1
        if self.warps == 8 and self.tile_m > self.tile_n:
            wm = 4
        return wm, self.warps // wm

    def thread_tile(self) -> tuple[int, int]:
        """(rows, cols) each thread of a simt block computes."""
        per = self.tile_m * self.tile_n // self.threads
        cols = 1 << (int(math.log2(per)) // 2)
        return per // cols, cols

    def shared_bytes(self, c: Contraction) -> int:
        if self.path == "mma":
            b_rows, b_cols = (self.tile_n, self.tile_k) if c.b_k_major else (self.tile_k, self.tile_n)
            return 2 * self.stages * (self.tile_m * (self.tile_k + PAD) + b_rows * (b_cols + PAD))
        if self.path == "simt":
            item = 8 if _compute(c) == DType.FLOAT64 else 4
            return item * self.tile_k * (self.tile_m + self.tile_n + 2)
        return 0

    def legal(self, c: Contraction) -> bool:
        if self.path in VENDOR_PATHS:
            lt = self.path == "cublaslt"
            return ((0 <= self.algo < LT_ALGOS if lt else self.algo == 0) and self.split == 1
                    and (c.stacked_rows or not self.batched) and vendor_plan(c, fold=lt) is not None)
        if self.batched or not c.a_k_major:
            return False
        if self.path not in PATHS or min(self.tile_m, self.tile_n, self.tile_k, self.warps, self.swizzle) < 1:
            return False
        if not self.split_legal(c) or self.shared_bytes(c) > MAX_SHARED_BYTES:
            return False
        per = self.tile_m * self.tile_n // self.threads  # accumulators per thread: more spill registers
        if self.path == "mma":
            wm, wn = self.warp_grid()
            return (c.tensor_cores and per <= 128 and self.stages >= 2 and self.tile_k % 16 == 0
                    and self.warps in (1, 2, 4, 8) and self.tile_m % (16 * wm) == 0 and self.tile_n % (16 * wn) == 0)
        rows, cols = self.thread_tile() if per >= 1 else (0, 0)
        staged = self.tile_k * (self.tile_m + self.tile_n) // self.threads  # prefetch registers per thread
        return (self.stages == 1 and 1 <= per <= 32 and staged <= 16 and rows * cols == per and self.tile_m % rows == 0
                and self.tile_n % cols == 0 and (self.tile_m * self.tile_k) % self.threads == 0
                and (self.tile_n * self.tile_k) % self.threads == 0)


def _compute(c: Contraction) -> DType:
    buffers = c.program.buffers.values()
    return DType.FLOAT64 if any(b.dtype == DType.FLOAT64 for b in buffers) else DType.FLOAT32


MMA_TILES = ((64, 64), (64, 128), (128, 64), (128, 128), (128, 256), (256, 128))
SIMT_TILES = ((32, 32), (32, 64), (64, 32), (64, 64), (32, 128), (128, 32), (64, 128), (128, 64), (128, 128))
SWIZZLES = (1, 4, 8)  # tile rows per raster group
SPLIT_K = (1, 2, 3, 4, 6, 8, 12, 16)  # parts the k tiles are cut into
MIN_SPLIT_TILES = 2  # k tiles a split-K part holds at least


def gemm_configs(c: Contraction) -> list[GemmConfig]:
    """Legal configurations for ``c``, the default first: cuBLASLt's first choice where cuBLASLt runs ``c`` in
    float32 arithmetic (on an H200, 2.5 to 3 times faster than mma tiles at fp16/bf16, and faster than every simt
    tile at fp32: ``bench/results/gemm_probe_h200.md``), else the generated kernels' default (mma for fp16/bf16
    operands, simt otherwise); then the generated tiles (each under every legal split-K), cuBLASLt's other ranks,
    cuBLAS; for stacked batches, each vendor configuration followed by its batched twin (which shape is faster
    depends on the rows a batch has: ``bench/README.md``, "Stacked vendor GEMMs")."""
    if c.tensor_cores:
        grid = product(MMA_TILES, (32, 64), (4, 8), (2, 3, 4), SWIZZLES)
        tiles = [GemmConfig("mma", tm, tn, tk, w, s, g) for (tm, tn), tk, w, s, g in grid]
        generated = GemmConfig("mma", 128, 128, 32, 4, 3, 8)
    else:
        grid = product(SIMT_TILES, (8, 16, 32), (1, 2, 4, 8), (1,), SWIZZLES)
        tiles = [GemmConfig("simt", tm, tn, tk, w, s, g) for (tm, tn), tk, w, s, g in grid]
        generated = GemmConfig("simt", 64, 64, 16, 4, 1, 8)
    # a tile's legality does not depend on its split: check it once, then only the splits
    found = [g for t in tiles if t.legal(c) for g in (replace(t, split=p) for p in SPLIT_K) if g.split_legal(c)]
    vendor = [*(GemmConfig("cublaslt", algo=r) for r in range(LT_ALGOS)), GemmConfig("cublas")]
    if c.stacked_rows:
        vendor = [v for g in vendor for v in (g, replace(g, batched=True))]
    first = vendor[0] if vendor[0].legal(c) and _compute(c) == DType.FLOAT32 else generated
    ordered, checked = [first, generated, *found, *vendor], set(found)
    return [g for g in dict.fromkeys(ordered) if g in checked or g.legal(c)]


@dataclass(frozen=True)
class VendorPlan:
    """What a vendor GEMM computes of a contraction: the product, then its first ``folded`` epilogue nests (a bias
    vector along n, then relu or tanh-gelu: :data:`LT_EPILOGUES`), written to buffer ``out`` in ``dtype``. ``out``
    is the last folded nest's buffer when that is an output; else an output of a later nest with that buffer's
    dtype (the epilogue kernel reads each element there before overwriting it; see ``_placements``); else that
    buffer's scratch."""

    folded: int
    bias: str | None
    activation: str | None
    out: str
    dtype: DType

    @property
    def epilogue(self) -> int:
        return LT_EPILOGUES[(self.bias is not None, self.activation)]


def vendor_plan(c: Contraction, *, fold: bool) -> VendorPlan | None:
    """How cuBLAS (``fold=False``) or cuBLASLt (``fold=True``: as much of the epilogue as it can take) runs ``c``;
    None when the operand types rule out every placement of the product."""
    if c.a.dtype != c.b.dtype or c.a.dtype not in VENDOR_DTYPES:
        return None
    written = {c.a.dtype, DType.FLOAT32} if c.a.dtype in MMA_DTYPES else {c.a.dtype}  # D types per operand type
    steps = _foldable(c) if fold else []
    for folded in range(len(steps), -1, -1):
        bias = next((arg for kind, arg in steps[:folded] if kind == "bias"), None)
        activation = next((arg for kind, arg in steps[:folded] if kind == "activation"), None)
        for out, dtype in _placements(c, folded):
            if dtype in written and (bias is None or c.program.buffers[bias].dtype == dtype):
                return VendorPlan(folded, bias, activation, out, dtype)
    return None


def _foldable(c: Contraction) -> list[tuple[str, str]]:
    """The leading epilogue nests cuBLASLt can apply: ("bias", vector buffer), then ("activation", op)."""
    program = c.program
    value = c.matmul.statement.write.tensor
    if c.matmul.statement.epilogue is not None:
        return []
    readers = [x.tensor for nest in program.nests for x in nest.statement.loads()]
    steps: list[tuple[str, str]] = []
    for nest in c.epilogue:
        body = nest.statement.body
        if program.buffers[value].kind != BufferKind.TEMP or readers.count(value) != 1 or not isinstance(body, Call):
            break
        own = [x for x in body.args if isinstance(x, Load) and x.access.tensor == value]
        others = [x for x in body.args if x not in own]
        bias = others[0] if len(others) == 1 and isinstance(others[0], Load) else None
        if body.op == "add" and not steps and len(own) == 1 and bias and _bias(program, nest, bias.access):
            steps.append(("bias", bias.access.tensor))
        elif body.op in ("relu", "gelu_tanh") and len(own) == 1 and not others:
            steps.append(("activation", body.op))
        else:
            break
        value = nest.statement.write.tensor
        if steps[-1][0] == "activation":
            break
    return steps


def _bias(program: LoopProgram, nest: LoopNest, access: Access) -> bool:
    """``access`` reads an input vector along the last (n) dim, the same for every row and batch."""
    if program.buffers[access.tensor].kind not in (BufferKind.INPUT, BufferKind.PARAM):
        return False
    dims = [d.name for d in nest.parallel]
    return _flat(access, program, dims) == ((len(dims) - 1, 1),)


def _placements(c: Contraction, folded: int) -> list[tuple[str, DType]]:
    """Where the vendor GEMM may write the value of epilogue nest ``folded`` (0: the product), best first: its own
    output; an output of a later nest with the value's dtype, unless a later sum or difference could cancel what
    rounding to that dtype kept; its scratch, in the compute type."""
    program = c.program
    value = program.nests[folded].statement.write.tensor
    buffer = program.buffers[value]
    if buffer.kind == BufferKind.OUTPUT:
        return [(value, buffer.dtype)]
    rest = [program.nests[0].statement.epilogue] if folded == 0 else []
    rest += [n.statement.body for n in program.nests[folded + 1:]]
    if any(isinstance(x, Call) and x.op in ("add", "sub") for e in rest if e is not None for x in walk(e)):
        return [(value, _compute(c))]
    later = [n for n in program.nests[folded + 1:] if row_major_store(program, n)]
    aliases = [(n.statement.write.tensor, buffer.dtype) for n in later
               if program.buffers[n.statement.write.tensor].kind == BufferKind.OUTPUT
               and program.buffers[n.statement.write.tensor].dtype == buffer.dtype]
    return [*aliases, (value, _compute(c))]


# ---------------------------------------------------------------------------------------------
# Recognising a contraction


def match_contraction(program: LoopProgram) -> Contraction | None:
    """The contraction ``program`` is once its views are folded (see the module docstring), or None. Its
    ``program`` is the folded one: what the gemm kernels run."""
    if not program.nests:
        return None
    program = fold_views(program)
    found = _matched(program)
    if found is None and (merged := merge_inner_dims(program)) is not None:
        found = _matched(merged)  # a 1x1 convolution: [n, o, h, w] as a batched GEMM over [n, o, h * w]
    return found


def _matched(program: LoopProgram) -> Contraction | None:
    mm = program.nests[0]
    st = mm.statement
    par = mm.parallel
    if (st.combiner != Combiner.SUM or len(mm.reduction) != 1 or len(par) < 2 or st.write.fill is not None
            or any(d.ragged for d in mm.dims) or not isinstance(st.body, Call) or st.body.op != "mul"
            or not all(isinstance(x, Load) for x in st.body.args)):
        return None
    dims = [d.name for d in par]
    m_dim, n_dim, k_dim = dims[-2], dims[-1], mm.reduction[0].name
    loads = [x.access for x in st.body.args if isinstance(x, Load)]
    a = next((x for x in loads if m_dim in x.dims()), None)
    b = next((x for x in loads if n_dim in x.dims() and x is not a), None)
    if a is None or b is None or n_dim in a.dims() or m_dim in b.dims():
        return None
    batch_dims = dims[:-2]
    ops = [_operand(program, x, batch_dims, outer, k_dim) for x, outer in ((a, m_dim), (b, n_dim))]
    if ops[0] is None or ops[1] is None or 1 not in (ops[0].k, ops[0].outer) or 1 not in (ops[1].k, ops[1].outer):
        return None
    if not row_major_store(program, mm):
        return None
    contraction = Contraction(program, tuple(d.extent for d in par[:-2]), par[-2].extent, par[-1].extent,
                              mm.reduction[0].extent, ops[0], ops[1])
    return contraction if epilogue_ok(program, mm) else None


def blas_contraction(program: LoopProgram) -> Contraction | None:
    """:func:`match_contraction`'s contraction when a BLAS call can compute its product (``gemm(blas)``): operands
    and every float buffer float32, or all float64 (the BLAS path keeps the product in the compute type)."""
    c = match_contraction(program)
    if c is None or c.a.dtype != c.b.dtype or c.a.dtype not in (DType.FLOAT32, DType.FLOAT64):
        return None
    non_float = (DType.INT32, DType.INT64, DType.BOOL)
    return c if all(b.dtype in (c.a.dtype, *non_float) for b in c.program.buffers.values()) else None


def _operand(program: LoopProgram, access: Access, batch: list[str], outer: str, k: str) -> Operand | None:
    strides = _strides(access, program, [*batch, outer, k])
    if strides is None or any(s < 0 for s in strides):
        return None
    return Operand(access.tensor, program.buffers[access.tensor].dtype, tuple(strides[:-2]), strides[-2], strides[-1])


def _strides(access: Access, program: LoopProgram, dims: Sequence[str]) -> list[int] | None:
    """The element stride of ``access`` along each of ``dims`` where its row-major offset is ``sum(stride * dim)``
    over them alone once the digits a reshape or a merged dim splits an index into cancel (``W * (q // W) + q % W``
    is ``q``: ``embed.loopnest.without_splits``); else None (a constant offset, an indirect read, another dim, a
    digit that stays)."""
    if access.fill is not None:
        return None
    offset = without_splits(access.offset(program.buffers[access.tensor].shape))
    coefs = {atom: coef for atom, coef in offset.terms}
    if offset.const or not set(coefs) <= set(dims):
        return None
    return [coefs.get(d, 0) for d in dims]


def _row_major(dims: Sequence[Dim]) -> tuple[tuple[int, int], ...]:
    """(position, stride) of each dim in a row-major array over ``dims``."""
    out, stride = [], 1
    for d in reversed(dims):
        out.append(stride)
        stride *= d.extent
    return tuple((i, s) for i, s in enumerate(reversed(out)))


def _flat(access: Access, program: LoopProgram, dims: list[str]) -> tuple[tuple[int, int], ...] | None:
    """The element offset of ``access`` as (dim position, stride) pairs, or None when it is not affine in ``dims``
    (:func:`_strides`)."""
    strides = _strides(access, program, dims)
    return None if strides is None else tuple((i, s) for i, s in enumerate(strides) if s)


def row_major_store(program: LoopProgram, nest: LoopNest) -> bool:
    """``nest`` writes each element of its parallel domain at the element's row-major offset (plainly, or through
    a reshape's index map), as a library GEMM or a vector store writes it."""
    dims = [d.name for d in nest.parallel]
    flat = _flat(nest.statement.write, program, dims)
    if flat is not None:
        return flat == _row_major(nest.parallel)
    return keeps_order(nest.statement.write, program.buffers[nest.statement.write.tensor].shape, nest.parallel)


def epilogue_ok(program: LoopProgram, mm: LoopNest) -> bool:
    """Every later nest is pointwise over the matmul's domain and reads earlier results at its own element; each
    writes row-major (``row_major_store``), or is a folded view storing a value through its index map."""
    extents = [d.extent for d in mm.parallel]
    written = {mm.statement.write.tensor: mm.statement.write}
    for nest in program.nests[1:]:
        st = nest.statement
        if st.combiner is not None or nest.reduction or [d.extent for d in nest.parallel] != extents:
            return False
        dims = [d.name for d in nest.parallel]
        view = nest.op in VIEWS and isinstance(st.body, Load) and st.body.access == written.get(st.body.access.tensor)
        if any(d.ragged for d in nest.dims) or not (view or row_major_store(program, nest)):
            return False
        own = _row_major(nest.parallel)
        if st.write.tensor in written or any(not _same_element(x, written[x.tensor], program, dims, own)
                                             for x in st.loads() if x.tensor in written):
            return False
        written[st.write.tensor] = st.write
    return True


def _same_element(read: Access, write: Access, program: LoopProgram, dims: list[str],
                  own: tuple[tuple[int, int], ...]) -> bool:
    """``read`` reads what ``write`` wrote at this element: the same index, or both at the row-major offset."""
    return read == write or (_flat(read, program, dims) == own and _flat(write, program, dims) == own)
