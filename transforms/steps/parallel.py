"""``parallel(n)`` (cpu): collapse the outer ``n`` row loops of each group into one ``omp parallel for``;
a group without parallel dims then splits its outermost reduction loop across threads. 0 is serial."""

from embed.loopnest import LoopProgram
from transforms.recipe import Step
from transforms.schedule import Schedule
from transforms.transformation import Transformation, expect_int

MAX_COLLAPSE = 3


class Parallel(Transformation):
    name = "parallel"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        if backend != "cpu":
            return []
        deepest = max(max(len(n.parallel) for n in program.nests), 1)
        return [[Step("parallel", (n,)) for n in range(min(deepest, MAX_COLLAPSE) + 1)]]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        return schedule.set(parallel=expect_int(step, 0, range(MAX_COLLAPSE + 1)))


STEP = Parallel()
