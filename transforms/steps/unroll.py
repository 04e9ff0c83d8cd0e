"""``unroll(N)``: unroll the innermost loop of every nest N times (``#pragma unroll``). 1 is off."""

from embed.loopnest import LoopProgram
from transforms.recipe import Step
from transforms.schedule import Schedule
from transforms.transformation import Transformation, expect_int

FACTORS = (1, 2, 4, 8)


class Unroll(Transformation):
    name = "unroll"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        return [[Step("unroll", (f,)) for f in FACTORS]]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        return schedule.set(unroll=expect_int(step, 0, FACTORS))


STEP = Unroll()
