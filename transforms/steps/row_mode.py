"""``row_mode(registers|online|stream|shared)`` (cuda): run row-shaped groups as row kernels (``codegen.cuda_rows``).

``registers`` holds each lane's share of a row in registers, so every fused member reuses what the first one
read; ``online`` streams the row, merging a max and a sum of exp (or a mean and a sum of squared deviations)
into one pass; ``stream`` streams every member; ``shared`` streams like ``online`` but copies inputs that later
passes read again into shared memory on the first pass. Offered when some group of the fully fused program has
row shape."""

from embed.loopnest import LoopProgram
from transforms.codegen.cuda_rows import MODES, has_row_groups
from transforms.recipe import Step
from transforms.schedule import Schedule
from transforms.transformation import Transformation, expect_ident


class RowMode(Transformation):
    name = "row_mode"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        if backend != "cuda" or not has_row_groups(program):
            return []
        return [[Step("row_mode", (m,)) for m in MODES]]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        return schedule.set(row_mode=expect_ident(step, 0, MODES))


STEP = RowMode()
