"""``reduce(mode[,lanes])``: how a reduction loop is folded.

cpu: ``serial``; ``simd`` (``omp simd reduction``, reassociates); ``lanes,K`` (K partial accumulators).
cuda: ``thread`` (one thread per row), ``warp`` (a warp per row, shuffle tree), ``block`` (the whole block
per row: shuffles, then shared memory across warps).
"""

from embed.loopnest import LoopProgram
from transforms.recipe import Step
from transforms.schedule import Schedule, ScheduleError
from transforms.transformation import Transformation, expect_ident, expect_int

MODES = {"cpu": ("serial", "simd", "lanes"), "cuda": ("thread", "warp", "block")}
LANES = (2, 4, 8)


class Reduce(Transformation):
    name = "reduce"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        if not any(n.reduction for n in program.nests):
            return []
        steps = [Step("reduce", (m,)) for m in MODES[backend] if m != "lanes"]
        if backend == "cpu":
            steps += [Step("reduce", ("lanes", k)) for k in LANES]
        return [steps]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        mode = expect_ident(step, 0, MODES["cpu"] + MODES["cuda"])
        if mode == "lanes":
            return schedule.set(reduce=mode, lanes=expect_int(step, 1, LANES))
        if len(step.args) > 1:
            raise ScheduleError(f"step {step}: reduce({mode}) takes no second argument")
        return schedule.set(reduce=mode, lanes=1)


STEP = Reduce()
