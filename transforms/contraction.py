"""GEMM-shaped programs and the GEMM kernel configurations that may run them (cuda ``gemm`` step).

A program is a *contraction* when its first nest is ``out[batch.., m, n] = sum_k a[.., m, k] * b[.., k, n]``
(or ``b[.., n, k]``: transpose_b) with a row-major write, and every later nest is pointwise over the same
output domain, reading what earlier nests wrote only at the same element: the epilogue (bias, activation,
residual, scale) can then run on the accumulators. :func:`match_contraction` recognises one and records
the operands' element strides; :func:`gemm_configs` lists the legal :class:`GemmConfig` for it.

    contraction = match_contraction(program)  # None when the program is not GEMM-shaped
    configs = gemm_configs(contraction)       # tensor-core tiles for fp16/bf16, SIMT tiles otherwise, cuBLAS
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product

from embed.ir import DType
from embed.loopnest import Access, Affine, Call, Combiner, Dim, Load, LoopNest, LoopProgram

PATHS = ("mma", "simt", "cublas")
MMA_DTYPES = (DType.FLOAT16, DType.BFLOAT16)
#: Dynamic shared memory a block may use (H100/H200 allow 227 KB per block after opting in).
MAX_SHARED_BYTES = 227 * 1024
PAD = 8  # elements of padding per shared-memory row: ldmatrix rows land on distinct banks


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
    def b_k_major(self) -> bool:
        """B holds k contiguously ([.., N, K], transpose_b); else n is contiguous ([.., K, N])."""
        return self.b.k == 1

    @property
    def tensor_cores(self) -> bool:
        return self.a.dtype == self.b.dtype and self.a.dtype in MMA_DTYPES


@dataclass(frozen=True)
class GemmConfig:
    """One way to run a contraction: ``mma`` (tensor cores, fp16/bf16), ``simt`` (register-blocked CUDA
    cores) or ``cublas`` (vendor GEMM, then one epilogue kernel). Block tile ``tile_m x tile_n`` stepping
    ``tile_k`` along k, ``warps`` per block, ``stages`` shared-memory buffers (cp.async pipeline depth; simt:
    1), and ``swizzle``: blocks are rasterised in groups of that many tile rows (L2 reuse of B)."""

    path: str
    tile_m: int = 0
    tile_n: int = 0
    tile_k: int = 0
    warps: int = 0
    stages: int = 0
    swizzle: int = 1

    @property
    def args(self) -> tuple[str | int, ...]:
        if self.path == "cublas":
            return (self.path,)
        return (self.path, self.tile_m, self.tile_n, self.tile_k, self.warps, self.stages, self.swizzle)

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
        if self.path == "cublas":
            return True
        if self.path not in PATHS or min(self.tile_m, self.tile_n, self.tile_k, self.warps, self.swizzle) < 1:
            return False
        if self.shared_bytes(c) > MAX_SHARED_BYTES:
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


def gemm_configs(c: Contraction) -> list[GemmConfig]:
    """Legal configurations for ``c``, the default first: mma for fp16/bf16 operands, simt otherwise; cuBLAS last."""
    if c.tensor_cores:
        grid = product(MMA_TILES, (32, 64), (4, 8), (2, 3, 4), SWIZZLES)
        found = [GemmConfig("mma", tm, tn, tk, w, s, g) for (tm, tn), tk, w, s, g in grid]
        default = GemmConfig("mma", 128, 128, 32, 4, 3, 8)
    else:
        grid = product(SIMT_TILES, (8, 16, 32), (1, 2, 4, 8), (1,), SWIZZLES)
        found = [GemmConfig("simt", tm, tn, tk, w, s, g) for (tm, tn), tk, w, s, g in grid]
        default = GemmConfig("simt", 64, 64, 16, 4, 1, 8)
    legal = [g for g in found if g.legal(c) and g != default]
    return [default, *legal, GemmConfig("cublas")] if default.legal(c) else [*legal, GemmConfig("cublas")]


# ---------------------------------------------------------------------------------------------
# Recognising a contraction


def match_contraction(program: LoopProgram) -> Contraction | None:
    """The contraction ``program`` is (see the module docstring), or None."""
    if not program.nests:
        return None
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
    if ops[0] is None or ops[1] is None or ops[0].k != 1 or 1 not in (ops[1].k, ops[1].outer):
        return None
    if _flat(st.write, program, dims) is None or _flat(st.write, program, dims) != _row_major(par):
        return None
    contraction = Contraction(program, tuple(d.extent for d in par[:-2]), par[-2].extent, par[-1].extent,
                              mm.reduction[0].extent, ops[0], ops[1])
    return contraction if epilogue_ok(program, mm) else None


def _operand(program: LoopProgram, access: Access, batch: list[str], outer: str, k: str) -> Operand | None:
    if access.fill is not None or any(not _plain(e) for e in access.index):
        return None
    shape = program.buffers[access.tensor].shape
    strides = [access.stride(d, shape) for d in (*batch, outer, k)]
    if any(s is None or s < 0 or s != int(s) for s in strides) or sum(e.const for e in access.index):
        return None
    ints = [int(s) for s in strides]  # type: ignore[arg-type]
    return Operand(access.tensor, program.buffers[access.tensor].dtype, tuple(ints[:-2]), ints[-2], ints[-1])


def _plain(expr: Affine) -> bool:
    return all(isinstance(atom, str) for atom, _ in expr.terms)


def _row_major(dims: Sequence[Dim]) -> tuple[tuple[int, int], ...]:
    """(position, stride) of each dim in a row-major array over ``dims``."""
    out, stride = [], 1
    for d in reversed(dims):
        out.append(stride)
        stride *= d.extent
    return tuple((i, s) for i, s in enumerate(reversed(out)))


def _flat(access: Access, program: LoopProgram, dims: list[str]) -> tuple[tuple[int, int], ...] | None:
    """The element offset of ``access`` as (dim position, stride) pairs, or None when it is not plain affine."""
    if access.fill is not None or any(not _plain(e) or e.const for e in access.index):
        return None
    shape = program.buffers[access.tensor].shape
    strides = [access.stride(d, shape) for d in dims]
    if any(s is None for s in strides):
        return None
    return tuple((i, int(s)) for i, s in enumerate(strides) if s)  # type: ignore[arg-type]


def epilogue_ok(program: LoopProgram, mm: LoopNest) -> bool:
    """Every later nest is pointwise over the matmul's domain and reads earlier results at its own element."""
    extents = [d.extent for d in mm.parallel]
    written = {mm.statement.write.tensor}
    for nest in program.nests[1:]:
        st = nest.statement
        if st.combiner is not None or nest.reduction or [d.extent for d in nest.parallel] != extents:
            return False
        dims = [d.name for d in nest.parallel]
        if any(d.ragged for d in nest.dims) or _flat(st.write, program, dims) != _row_major(nest.parallel):
            return False
        own = _row_major(nest.parallel)
        if st.write.tensor in written or any(_flat(x, program, dims) != own for x in st.loads() if x.tensor in written):
            return False
        written.add(st.write.tensor)
    return True
