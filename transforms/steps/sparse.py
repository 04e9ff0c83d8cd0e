"""``sparse(csr[,V])`` / ``sparse(ell,W)``: the iteration format of a ragged (CSR) reduction, as in SpMM.

The kernel always receives CSR (``indptr``, ``indices``, ``values``); the format is how a row's nonzeros are
walked. ``csr`` is the plain ragged loop ``for r in [indptr[i], indptr[i + 1])``. ``csr,V`` processes the dense
operand's columns (``p0``) ``V`` at a time inside that loop: each nonzero's value and column index are read once
for ``V`` accumulators (cpu: ``p0`` strip-mined by ``V``, overriding ``tile(p0)``; cuda: a row's columns are
strided across its lanes ``V`` consecutive ones per lane). ``ell,W`` is ELL computed on the fly from CSR: a row
is walked in chunks of ``W`` nonzeros with predication (the tail of the last chunk adds the identity), so every
chunk has the same fixed trip count ``W`` across SIMD lanes / the lanes of a warp (cuda: chunks of ``W`` nonzeros
per lane). No ELL storage is built. Offered when the program has a ragged reduction."""

from embed.loopnest import LoopProgram
from transforms.recipe import Step
from transforms.schedule import Schedule, ScheduleError
from transforms.transformation import Transformation, expect_ident, expect_int

FORMATS = ("csr", "ell")
WIDTHS = {"cpu": (("csr", 1), ("csr", 4), ("csr", 8), ("ell", 4), ("ell", 8)),
          "cuda": (("csr", 1), ("csr", 2), ("csr", 4), ("ell", 2), ("ell", 4))}
MAX_WIDTH = 64


class Sparse(Transformation):
    name = "sparse"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        if not any(d.ragged is not None for n in program.nests for d in n.reduction):
            return []
        return [[Step("sparse", (f,) if w == 1 else (f, w)) for f, w in WIDTHS[backend]]]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        kind = expect_ident(step, 0, FORMATS)
        width = expect_int(step, 1) if len(step.args) > 1 else 1
        if not 1 <= width <= MAX_WIDTH:
            raise ScheduleError(f"step {step}: width must be in [1, {MAX_WIDTH}]")
        return schedule.set(sparse=(kind, width))


STEP = Sparse()
