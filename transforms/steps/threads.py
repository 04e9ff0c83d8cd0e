"""``threads(N)`` (cuda): threads per block."""

from embed.loopnest import LoopProgram
from transforms.recipe import Step
from transforms.schedule import Schedule
from transforms.transformation import Transformation, expect_int

COUNTS = (32, 64, 128, 256, 512, 1024)


class Threads(Transformation):
    name = "threads"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        return [[Step("threads", (n,)) for n in COUNTS]] if backend == "cuda" else []

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        return schedule.set(threads=expect_int(step, 0, COUNTS))


STEP = Threads()
