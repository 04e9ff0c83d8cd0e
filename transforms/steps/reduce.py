"""``reduce(mode[,K])``: how a reduction loop is folded.

cpu: ``serial``; ``simd`` (``omp simd reduction``, reassociates); ``lanes,K`` (K partial accumulators).
cuda: ``thread`` (one thread per row), ``lanes,K`` (K lanes of a warp per row: short rows, sub-warp shuffles),
``warp`` (a warp per row, shuffle tree), ``block`` (the whole block per row: shuffles, then shared memory),
``split,S`` (each row cut across up to S blocks whose partials a later launch merges: few, long rows;
``transforms.codegen.cuda_split``, S in the schedule's ``split``). ``split`` is offered only where every
reduction group is a row reduction under every fuse mode, with the S that suit its row count and length
(``cuda_split.split_choices``); elsewhere its code generation is a ScheduleError.
"""

from embed.loopnest import LoopProgram
from transforms.codegen.cuda_split import SPLITS, default_split, split_choices
from transforms.recipe import Step
from transforms.schedule import Schedule, ScheduleError
from transforms.transformation import Transformation, expect_ident, expect_int

MODES = {"cpu": ("serial", "simd", "lanes"), "cuda": ("thread", "warp", "block", "lanes", "split")}
LANES = {"cpu": (2, 4, 8), "cuda": (4, 8, 16)}


class Reduce(Transformation):
    name = "reduce"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        if not any(n.reduction for n in program.nests):
            return []
        steps = [Step("reduce", (m,)) for m in MODES[backend] if m not in ("lanes", "split")]
        steps += [Step("reduce", ("lanes", k)) for k in LANES[backend]]
        if backend == "cuda":
            steps += [Step("reduce", ("split", s)) for s in split_choices(program)]
        return [steps]

    def preferred(self, program: LoopProgram, backend: str) -> Step | None:
        """cuda: ``split`` for few long rows (``cuda_split.default_split``)."""
        s = default_split(program) if backend == "cuda" and any(n.reduction for n in program.nests) else None
        return None if s is None else Step("reduce", ("split", s))

    def nearest(self, step: Step, program: LoopProgram, backend: str) -> Step | None:
        """As ``Transformation.nearest``, but a ``split`` step where no split is offered becomes ``block`` (a row
        per block is the closest strategy to a row over several), not the ``lanes`` step nearest by its number."""
        offered = [s for g in self.offered(program, backend) for s in g]
        if step.args[:1] == ("split",) and not any(s.args[:1] == ("split",) for s in offered):
            step = Step("reduce", ("block",))
        return super().nearest(step, program, backend)

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        mode = expect_ident(step, 0, MODES["cpu"] + MODES["cuda"])
        if mode == "lanes":
            lanes = expect_int(step, 1, sorted({*LANES["cpu"], *LANES["cuda"]}))
            return schedule.set(reduce=mode, lanes=lanes, split=0)
        if mode == "split":
            return schedule.set(reduce=mode, lanes=1, split=expect_int(step, 1, SPLITS))
        if len(step.args) > 1:
            raise ScheduleError(f"step {step}: reduce({mode}) takes no second argument")
        return schedule.set(reduce=mode, lanes=1, split=0)


STEP = Reduce()
