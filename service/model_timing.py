"""Whole-model timing: a model measured as one run, the number that judges a plan.

cuda: CUDA events around each call after warm-up, the inputs rotated over copies that together exceed twice the
L2 cache (so the first layer reads from device memory), median of the calls. cpu: ``time.perf_counter`` per call,
median. The callable is what a user runs (a ``PlanModule``, the eager module, a ``torch.compile``-d module).
"""

import math
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from transforms.worker import copies_past_l2

Model = Callable[..., object]


def seconds_per_call(model: Model, inputs: Sequence[torch.Tensor], *, calls: int = 20, warmup: int = 3) -> float:
    """Median seconds of ``model(*inputs)``; NaN when it fails."""
    cuda = any(t.is_cuda for t in inputs)
    sets = [list(inputs)]
    if cuda:
        set_bytes = sum(t.numel() * t.element_size() for t in inputs)
        copies = copies_past_l2(set_bytes, torch.cuda.get_device_properties(inputs[0].device).L2_cache_size)
        sets += [[t.clone() for t in inputs] for _ in range(min(copies, 8) - 1)]
    try:
        with torch.no_grad():
            for k in range(warmup):
                model(*sets[k % len(sets)])
            times = _cuda_times(model, sets, calls) if cuda else _cpu_times(model, sets, calls)
    except Exception:  # a model that fails is reported without a time, not a crash of the report
        return math.nan
    return float(np.median(times))


def _cpu_times(model: Model, sets: list[list[torch.Tensor]], calls: int) -> list[float]:
    times = []
    for k in range(calls):
        start = time.perf_counter()
        model(*sets[k % len(sets)])
        times.append(time.perf_counter() - start)
    return times


def _cuda_times(model: Model, sets: list[list[torch.Tensor]], calls: int) -> list[float]:
    torch.cuda.synchronize()
    times = []
    for k in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model(*sets[k % len(sets)])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return times
