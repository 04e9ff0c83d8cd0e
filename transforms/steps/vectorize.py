"""``vectorize(W)``: SIMD over the innermost loop of every nest. 1 is off. cpu: ``omp simd simdlen(W)``; cuda
(row kernels, see ``row_mode``): each lane takes ``W`` consecutive elements, moved as words of up to 16 bytes
where contiguous and aligned."""

from embed.loopnest import LoopProgram
from transforms.recipe import Step
from transforms.schedule import Schedule
from transforms.steps.row_mode import STEP as STEP_ROWS
from transforms.transformation import Transformation, expect_int

WIDTHS = (1, 4, 8, 16)
CUDA_WIDTHS = (8, 4, 2, 1)  # the first is the default


class Vectorize(Transformation):
    name = "vectorize"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        if backend == "cuda":
            return [[Step("vectorize", (w,)) for w in CUDA_WIDTHS]] if STEP_ROWS.choices(program, backend) else []
        return [[Step("vectorize", (w,)) for w in WIDTHS]]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        return schedule.set(vector=expect_int(step, 0, sorted({*WIDTHS, *CUDA_WIDTHS})))


STEP = Vectorize()
