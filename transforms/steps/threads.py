"""``threads(N)`` (cuda): threads per block.

The first choice (the default) follows the program's row groups (``codegen.cuda_rows``), as measured on an H200
(``bench/results/gpu_sweep_h200.md``): 128 when every row group is pointwise (bias + gelu 8192x3072: 1.42x the
DRAM bound, 1.51x at 256), 512 when a reduced row is too long for registers at 256 lanes (softmax 2048x32000 in
shared memory: 1.61x, 1.67x at 256), else 256 (softmax and layernorm 8192x4096: 1.14x and 1.17x, 1.24x and 1.23x
at 512). Layouts (nests the ``stage`` step tiles) keep 256."""

from embed.loopnest import LoopProgram
from transforms.codegen.cuda_rows import MAX_REGISTER_ELEMS, row_group, row_length
from transforms.codegen.cuda_stage import stage_plan
from transforms.recipe import Step
from transforms.schedule import Schedule, plan_groups
from transforms.transformation import Transformation, expect_int

COUNTS = (32, 64, 128, 256, 512, 1024)


def preferred(program: LoopProgram) -> int:
    """The default threads per block of ``program`` (see the module docstring)."""
    shapes = {n: b.shape for n, b in program.buffers.items()}
    groups = [g for g in map(row_group, plan_groups(program, "all")) if g is not None]
    if not groups or any(stage_plan(n, shapes) for n in program.nests):
        return 256
    reduced = [g for g in groups if any(m.statement.combiner is not None for m in g.members)]
    if not reduced:
        return 128
    return 512 if any(row_length(g) > 256 * MAX_REGISTER_ELEMS for g in reduced) else 256


class Threads(Transformation):
    name = "threads"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        if backend != "cuda":
            return []
        first = preferred(program)
        return [[Step("threads", (n,)) for n in sorted(COUNTS, key=lambda n: n != first)]]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        return schedule.set(threads=expect_int(step, 0, COUNTS))


STEP = Threads()
