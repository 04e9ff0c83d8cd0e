"""``rows_per_block(R)`` (cuda): rows of a row-reduction group handled by one block (each by its own warp
or thread group), so short rows still fill a block."""

from embed.loopnest import LoopProgram
from transforms.recipe import Step
from transforms.schedule import Schedule
from transforms.transformation import Transformation, expect_int

ROWS = (1, 2, 4, 8)


class RowsPerBlock(Transformation):
    name = "rows_per_block"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        if backend != "cuda" or not any(n.reduction and n.parallel for n in program.nests):
            return []
        return [[Step("rows_per_block", (r,)) for r in ROWS]]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        return schedule.set(rows_per_block=expect_int(step, 0, ROWS))


STEP = RowsPerBlock()
