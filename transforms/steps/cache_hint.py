"""``cache_hint(none|stream)`` (cuda): streaming cache hints on a row kernel's once-touched data.

With ``stream``, row kernels load the words of inputs larger than one row with ``__ldcs`` and store their outputs
with ``__stcs`` (evict-first: the data is touched once), leaving the row-sized parameters (weights, biases) cached
as usual. It pays where a kernel is memory-bound and its rows are reused from L2 by nothing else (layernorm
8192x4096 1.18 -> 1.15x the DRAM bound, 8192x768 1.60 -> 1.51x) and costs elsewhere (bias+gelu 16384x4096 1.05 ->
1.16x): ``bench/results/kernel_probe_hints_h200.md``, so the search decides. Offered where ``row_mode`` is."""

from embed.loopnest import LoopProgram
from transforms.codegen.cuda_rows import has_row_groups
from transforms.recipe import Step
from transforms.schedule import Schedule
from transforms.transformation import Transformation, expect_ident

HINTS = ("none", "stream")


class CacheHint(Transformation):
    name = "cache_hint"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        if backend != "cuda" or not has_row_groups(program):
            return []
        return [[Step("cache_hint", (h,)) for h in HINTS]]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        return schedule.set(stream=expect_ident(step, 0, HINTS) == "stream")


STEP = CacheHint()
