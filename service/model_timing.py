"""Whole-model timing: a model measured as one run, the number that judges a plan.

Models compared with each other are timed interleaved, one call of each in turn, so that a drift of the machine
(clocks, other processes, the host's launch speed) moves them alike instead of favouring whichever ran first.
cuda: CUDA events around each call after warm-up, the inputs rotated over copies that together exceed twice the
L2 cache (so the first layer reads from device memory). cpu: ``time.perf_counter`` per call. The median of the
calls is the time. A model is what a user runs (a ``PlanModule``, the eager module, a ``torch.compile``-d module).
"""

import math
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from transforms.worker import copies_past_l2

Model = Callable[..., object]
MAX_INPUT_SETS = 8


def compare(models: Sequence[Model], inputs: Sequence[torch.Tensor], *, calls: int = 20,
            warmup: int = 3) -> list[float]:
    """Median seconds per call of each model on ``inputs``, timed round-robin; NaN for a model that fails."""
    sets = _input_sets(inputs)
    alive = []
    with torch.no_grad():
        for model in models:
            try:
                for k in range(warmup):
                    model(*sets[k % len(sets)])
                alive.append(model)
            except Exception:  # a model that fails is reported without a time, not a crash of the report
                alive.append(None)
        times: list[list[float]] = [[] for _ in models]
        for k in range(calls):
            for n, model in enumerate(alive):
                if model is None:
                    continue
                try:
                    times[n].append(_one_call(model, sets[k % len(sets)]))
                except Exception:
                    alive[n] = None
    return [float(np.median(t)) if alive[n] is not None and t else math.nan for n, t in enumerate(times)]


def _input_sets(inputs: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    sets = [list(inputs)]
    if any(t.is_cuda for t in inputs):
        set_bytes = sum(t.numel() * t.element_size() for t in inputs)
        copies = copies_past_l2(set_bytes, torch.cuda.get_device_properties(inputs[0].device).L2_cache_size)
        sets += [[t.clone() for t in inputs] for _ in range(min(copies, MAX_INPUT_SETS) - 1)]
    return sets


def _one_call(model: Model, inputs: list[torch.Tensor]) -> float:
    if not any(t.is_cuda for t in inputs):
        start = time.perf_counter()
        model(*inputs)
        return time.perf_counter() - start
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.current_stream().synchronize()
    start.record()
    model(*inputs)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3
