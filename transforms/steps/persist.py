"""``persist(B)`` (cuda): run row kernels persistently, ``B`` blocks per multiprocessor (0: a block per row group).

The grid holds at most ``B`` blocks per SM (``cuda_rows.persistent_grid``) and ``__launch_bounds__`` asks for
``B`` of them to fit; each row group of a block loops over the rows with the grid's stride, loading the next row's
input words into registers while it reduces and writes the current one. For many short rows (8192 x 768), where
a block per row group ends after one short load, reduce and store. Offered where ``row_mode`` is."""

from transforms.recipe import Step
from transforms.schedule import Schedule
from transforms.steps.row_kernel import RowKernelStep
from transforms.transformation import expect_int

BLOCKS = (0, 2, 4, 8)


class Persist(RowKernelStep):
    name = "persist"
    values = BLOCKS

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        return schedule.set(persist=expect_int(step, 0, BLOCKS))


STEP = Persist()
