"""``cache_hint(none|stream)`` (cuda): streaming cache hints on a row kernel's once-touched data.

With ``stream``, row kernels load the words of inputs larger than one row with ``__ldcs`` and store their outputs
with ``__stcs`` (evict-first: the data is touched once), leaving the row-sized parameters (weights, biases) cached
as usual. It pays where a kernel is memory-bound and its rows are reused from L2 by nothing else (layernorm
8192x4096 1.18 -> 1.15x the DRAM bound, 8192x768 1.60 -> 1.51x) and costs elsewhere (bias+gelu 16384x4096 1.05 ->
1.16x): ``bench/results/kernel_probe_hints_h200.md``, so the search decides. Offered where ``row_mode`` is."""

from transforms.recipe import Step
from transforms.schedule import Schedule
from transforms.steps.row_kernel import RowKernelStep
from transforms.transformation import expect_ident

HINTS = ("none", "stream")


class CacheHint(RowKernelStep):
    name = "cache_hint"
    values = HINTS

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        return schedule.set(stream=expect_ident(step, 0, HINTS) == "stream")


STEP = CacheHint()
