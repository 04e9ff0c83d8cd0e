"""``vectorize(W)``: SIMD over the innermost parallel loop of every nest (cpu: ``omp simd simdlen(W)``). 1 is off.
cpu only for now."""

from embed.loopnest import LoopProgram
from transforms.recipe import Step
from transforms.schedule import Schedule
from transforms.transformation import Transformation, expect_int

WIDTHS = (1, 4, 8, 16)


class Vectorize(Transformation):
    name = "vectorize"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        return [[Step("vectorize", (w,)) for w in WIDTHS]] if backend == "cpu" else []

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        return schedule.set(vector=expect_int(step, 0, WIDTHS))


STEP = Vectorize()
