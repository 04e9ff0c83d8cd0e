"""``reduce(mode[,lanes])``: how a reduction loop is folded.

cpu: ``serial``; ``simd`` (``omp simd reduction``, reassociates); ``lanes,K`` (K partial accumulators).
cuda: ``thread`` (one thread per row), ``lanes,K`` (K lanes of a warp per row: short rows, sub-warp shuffles),
``warp`` (a warp per row, shuffle tree), ``block`` (the whole block per row: shuffles, then shared memory).
"""

from embed.loopnest import LoopProgram
from transforms.recipe import Step
from transforms.schedule import Schedule, ScheduleError
from transforms.transformation import Transformation, expect_ident, expect_int

MODES = {"cpu": ("serial", "simd", "lanes"), "cuda": ("thread", "warp", "block", "lanes")}
LANES = {"cpu": (2, 4, 8), "cuda": (4, 8, 16)}


class Reduce(Transformation):
    name = "reduce"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        if not any(n.reduction for n in program.nests):
            return []
        steps = [Step("reduce", (m,)) for m in MODES[backend] if m != "lanes"]
        return [steps + [Step("reduce", ("lanes", k)) for k in LANES[backend]]]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        mode = expect_ident(step, 0, MODES["cpu"] + MODES["cuda"])
        if mode == "lanes":
            return schedule.set(reduce=mode, lanes=expect_int(step, 1, sorted({*LANES["cpu"], *LANES["cuda"]})))
        if len(step.args) > 1:
            raise ScheduleError(f"step {step}: reduce({mode}) takes no second argument")
        return schedule.set(reduce=mode, lanes=1)


STEP = Reduce()
