"""Whole-model timing: a model measured as one run, the number that judges a plan.

A model is timed as a user's loop runs it: calls back to back, in bursts, with nothing waiting for the GPU between
the calls of a burst. Each call's time is then what the loop pays for it: its GPU time when the host keeps ahead,
the host's launch time when it does not (a model whose Python launches ops slower than the GPU runs them is
host-bound; timing each call from an idle GPU would charge it launch latency that a loop hides, and flatter a plan
that saves launches). cuda: CUDA events around each call, after warm-up, the inputs rotated over copies that
together exceed twice the L2 cache (so the first layer reads from device memory). cpu: ``time.perf_counter`` per
call. The median of the calls is the time.

Models compared with each other take bursts in turn, the order reversed every round (A B, B A, ...), so that a
drift of the machine (clocks, other processes, the host's launch speed) moves them alike instead of favouring
whichever ran first. A model is what a user runs (a ``PlanModule``, the eager module, a ``torch.compile``-d module).
"""

import math
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from transforms.worker import copies_past_l2

Model = Callable[..., object]
MAX_INPUT_SETS = 8


def compare(models: Sequence[Model], inputs: Sequence[torch.Tensor], *, calls: int = 20, burst: int = 10,
            warmup: int = 3) -> list[float]:
    """Median seconds per call of each model on ``inputs``, ``calls`` calls timed in bursts of ``burst``, the models
    taking bursts in turn; NaN for a model that fails."""
    sets = _input_sets(inputs)
    alive: list[Model | None] = []
    with torch.no_grad():
        for model in models:
            try:
                for k in range(warmup):
                    model(*sets[k % len(sets)])
                alive.append(model)
            except Exception:  # a model that fails is reported without a time, not a crash of the report
                alive.append(None)
        times: list[list[float]] = [[] for _ in models]
        for turn in range(math.ceil(calls / burst)):
            order = range(len(models)) if turn % 2 == 0 else reversed(range(len(models)))
            for n in order:
                model = alive[n]
                if model is None:
                    continue
                try:
                    times[n] += _burst(model, sets, turn * burst, min(burst, calls - turn * burst))
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


def _burst(model: Model, sets: list[list[torch.Tensor]], first: int, calls: int) -> list[float]:
    """Seconds of each of ``calls`` back-to-back calls, rotating the input sets from ``first``."""
    if not any(t.is_cuda for t in sets[0]):
        seconds = []
        for k in range(first, first + calls):
            start = time.perf_counter()
            model(*sets[k % len(sets)])
            seconds.append(time.perf_counter() - start)
        return seconds
    torch.cuda.current_stream().synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    for k, (start, end) in enumerate(events, first):
        start.record()
        model(*sets[k % len(sets)])
        end.record()
    events[-1][1].synchronize()
    return [start.elapsed_time(end) * 1e-3 for start, end in events]
