"""``unroll(N)``: unroll the innermost loop of every nest N times (``#pragma unroll``). 1 is off.

The first choice is the default: 1 on cpu; 4 on cuda, where streaming row loops and single-block reductions then
keep four loads in flight (softmax 2048x32000 online on an H200: 1.71x the DRAM bound, 1.76x unrolled once)."""

from embed.loopnest import LoopProgram
from transforms.recipe import Step
from transforms.schedule import Schedule
from transforms.transformation import Transformation, expect_int

FACTORS = (1, 2, 4, 8)
CUDA_FACTORS = (4, 1, 2, 8)


class Unroll(Transformation):
    name = "unroll"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        return [[Step("unroll", (f,)) for f in (CUDA_FACTORS if backend == "cuda" else FACTORS)]]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        return schedule.set(unroll=expect_int(step, 0, FACTORS))


STEP = Unroll()
