"""``vectorize(W)``: SIMD over the innermost parallel loop of every nest (cpu: ``omp simd simdlen(W)``;
cuda: W consecutive elements per thread, with vector loads where the layout allows). 1 is off."""

from embed.loopnest import LoopProgram
from transforms.recipe import Step
from transforms.schedule import Schedule
from transforms.transformation import Transformation, expect_int

WIDTHS = {"cpu": (1, 4, 8, 16), "cuda": (1, 2, 4)}


class Vectorize(Transformation):
    name = "vectorize"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        return [[Step("vectorize", (w,)) for w in WIDTHS[backend]]]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        return schedule.set(vector=expect_int(step, 0, (1, 2, 4, 8, 16)))


STEP = Vectorize()
