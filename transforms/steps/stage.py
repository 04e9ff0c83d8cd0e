"""``stage(T,E)`` (cuda): run pointwise nests whose loads are strided along ``p0`` (transposes, permutes) through
shared-memory tiles of ``T x T``, ``E`` elements per thread (``transforms.codegen.cuda_stage``); ``stage(0)`` is
off. Offered when some nest qualifies; it applies to the one-nest groups that do."""

from embed.loopnest import LoopProgram
from transforms.codegen.cuda_stage import CTYPE_BYTES, SHARED_BYTES, stage_plan
from transforms.codegen.kernel import codegen_context
from transforms.recipe import Step
from transforms.schedule import Schedule, ScheduleError
from transforms.transformation import Transformation, expect_int

TILES = (32, 16, 64)
PER_THREAD = (4, 8, 2, 1)
MIN_THREADS, MAX_THREADS = 32, 1024


def _legal(tile: int, per_thread: int) -> bool:
    return tile % per_thread == 0 and MIN_THREADS <= tile * tile // per_thread <= MAX_THREADS


class Stage(Transformation):
    name = "stage"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        shapes = {n: b.shape for n, b in program.buffers.items()}
        if backend != "cuda" or not any(stage_plan(n, shapes) for n in program.nests):
            return []
        size = CTYPE_BYTES[codegen_context(program).ctype]
        steps = [Step("stage", (t, e)) for t in TILES for e in PER_THREAD
                 if _legal(t, e) and t * (t + 1) * size <= SHARED_BYTES]
        return [[Step("stage", (0,)), *steps]]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        tile = expect_int(step, 0, (0, *TILES))
        if tile == 0:
            if len(step.args) > 1:
                raise ScheduleError(f"step {step}: stage(0) takes no other argument")
            return schedule.set(stage=(0, 0))
        per_thread = expect_int(step, 1, PER_THREAD)
        if len(step.args) > 2 or not _legal(tile, per_thread):
            raise ScheduleError(f"step {step}: stage(T,E) needs {MIN_THREADS} <= T*T/E <= {MAX_THREADS} threads")
        return schedule.set(stage=(tile, per_thread))


STEP = Stage()
