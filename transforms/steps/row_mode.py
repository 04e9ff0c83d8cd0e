"""``row_mode(registers|online|stream|shared)`` (cuda): run row-shaped groups as row kernels (``codegen.cuda_rows``).

``registers`` holds each lane's share of a row in registers, so every fused member reuses what the first one
read; ``online`` streams the row, merging a max and a sum of exp (or a mean and a sum of squared deviations)
into one pass; ``stream`` streams every member; ``shared`` streams like ``online`` but copies inputs that later
passes read again into shared memory on the first pass. Offered when some group of the fully fused program has
row shape."""

from transforms.codegen.cuda_rows import MODES
from transforms.recipe import Step
from transforms.schedule import Schedule
from transforms.steps.row_kernel import RowKernelStep
from transforms.transformation import expect_ident


class RowMode(RowKernelStep):
    name = "row_mode"
    values = MODES

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        return schedule.set(row_mode=expect_ident(step, 0, MODES))


STEP = RowMode()
