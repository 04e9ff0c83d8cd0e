"""``row_depth(D)`` (cuda): a one-nest group keeps only its outer ``D`` parallel dims as rows (0: all of them);
the inner parallel dims are strided across the row's lanes, each lane reducing serially. A warp then walks a
row's contiguous columns (coalesced), e.g. one CSR row per warp in SpMM, or one output row per warp."""

from embed.loopnest import LoopProgram
from transforms.recipe import Step
from transforms.schedule import Schedule
from transforms.transformation import Transformation, expect_int

DEPTHS = (0, 1)


class RowDepth(Transformation):
    name = "row_depth"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        if backend != "cuda" or not any(len(n.parallel) > 1 for n in program.nests):
            return []
        return [[Step("row_depth", (d,)) for d in DEPTHS]]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        return schedule.set(row_depth=expect_int(step, 0, DEPTHS))


STEP = RowDepth()
