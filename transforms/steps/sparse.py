"""``sparse(csr[,V])`` / ``sparse(ell,W)`` / ``sparse(merge,C[,V])``: how a ragged (CSR) reduction, as in SpMM, walks
its nonzeros.

The kernel always receives CSR (``indptr``, ``indices``, ``values``); the format is how a row's nonzeros are
walked. ``csr`` is the plain ragged loop ``for r in [indptr[i], indptr[i + 1])``. ``csr,V`` processes the dense
operand's columns (``p0``) ``V`` at a time inside that loop: each nonzero's value and column index are read once
for ``V`` accumulators (cpu: ``p0`` strip-mined by ``V``, overriding ``tile(p0)``; cuda: a row's columns are
strided across its lanes ``V`` consecutive ones per lane). ``ell,W`` is ELL computed on the fly from CSR: a row
is walked in chunks of ``W`` nonzeros with predication (the tail of the last chunk adds the identity), so every
chunk has the same fixed trip count ``W`` across SIMD lanes / the lanes of a warp (cuda: chunks of ``W`` nonzeros
per lane). No ELL storage is built. ``merge,C,V`` (cuda, a CSR product with a pointwise epilogue: spmm) balances
the work by nonzeros instead of rows: each lane group takes ``C`` consecutive nonzeros and ``V`` columns per lane,
rows cut by a chunk boundary are summed with atomics (``transforms.codegen.cuda_spmm``), so a hub row of a skewed
graph is spread over many groups; it uses ``threads`` and ignores the other cuda knobs. The cpu backend walks a
``merge`` recipe's rows like ``csr``. Offered when the program has a ragged reduction."""

from itertools import product

from embed.loopnest import LoopProgram
from transforms.codegen.cuda_spmm import match_sparse_product
from transforms.recipe import Step
from transforms.schedule import Schedule, ScheduleError
from transforms.transformation import Transformation, expect_ident, expect_int

FORMATS = ("csr", "ell", "merge")
WIDTHS = {"cpu": (("csr", 1), ("csr", 4), ("csr", 8), ("ell", 4), ("ell", 8)),
          "cuda": (("csr", 1), ("csr", 2), ("csr", 4), ("ell", 2), ("ell", 4))}
MERGE = tuple(product((256, 1024), (1, 2, 4)))  # (C, V) offered on cuda
MAX_WIDTH = 64
MAX_CHUNK = 1 << 20


class Sparse(Transformation):
    name = "sparse"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        if not any(d.ragged is not None for n in program.nests for d in n.reduction):
            return []
        steps = [Step("sparse", (f,) if w == 1 else (f, w)) for f, w in WIDTHS[backend]]
        if backend == "cuda" and match_sparse_product(program) is not None:
            steps += [Step("sparse", ("merge", c) if v == 1 else ("merge", c, v)) for c, v in MERGE]
        return [steps]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        kind = expect_ident(step, 0, FORMATS)
        chunk = expect_int(step, 1) if kind == "merge" else 0
        if kind == "merge" and not 1 <= chunk <= MAX_CHUNK:
            raise ScheduleError(f"step {step}: the chunk must be in [1, {MAX_CHUNK}] nonzeros")
        at = 2 if kind == "merge" else 1
        if len(step.args) > at + 1:
            raise ScheduleError(f"step {step}: too many arguments")
        width = expect_int(step, at) if len(step.args) > at else 1
        if not 1 <= width <= MAX_WIDTH:
            raise ScheduleError(f"step {step}: width must be in [1, {MAX_WIDTH}]")
        return schedule.set(sparse=(kind, width), chunk=chunk)


STEP = Sparse()
