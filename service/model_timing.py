"""Whole-model timing: a model measured as one run, the number that judges a plan.

A model is timed as a user's loop runs it: calls back to back, in bursts, with nothing waiting for the GPU between
the calls of a burst. Each call's time is then what the loop pays for it: its GPU time when the host keeps ahead,
the host's launch time when it does not (a model whose Python launches ops slower than the GPU runs them is
host-bound; timing each call from an idle GPU would charge it launch latency that a loop hides, and flatter a plan
that saves launches). cuda: CUDA events around each call, after warm-up, the inputs rotated over copies that
together exceed twice the L2 cache (so the first layer reads from device memory). cpu: ``time.perf_counter`` per
call. The median of the calls is the time.

A model can be timed at its GPU time instead (``gpu_time``): each burst starts behind a GPU busy-wait long enough
for the host to queue the whole burst, so no call waits on the host. That is the model on a host fast enough to keep
up with it; tunebank times eager so when it judges a plan, so a plan kept is no slower than eager on any host.

Models compared with each other take bursts in turn, the order reversed every round (A B, B A, ...), so that a
drift of the machine (clocks, other processes, the host's launch speed) moves them alike instead of favouring
whichever ran first. A model is what a user runs (a ``PlanModule``, the eager module, a ``torch.compile``-d module).
"""

import functools
import math
import time
from collections.abc import Callable, Collection, Sequence

import numpy as np
import torch

from transforms.worker import copies_past_l2

Model = Callable[..., object]
MAX_INPUT_SETS = 8
MAX_HEAD_START_S = 0.2


def compare(models: Sequence[Model], inputs: Sequence[torch.Tensor], *, calls: int = 20, burst: int = 10,
            warmup: int = 3, gpu_time: Collection[int] = ()) -> list[float]:
    """Median seconds per call of each model on ``inputs``, ``calls`` calls timed in bursts of ``burst``, the models
    taking bursts in turn; NaN for a model that fails. Models whose index is in ``gpu_time`` are timed at their GPU
    time (cuda only)."""
    sets = _input_sets(inputs)
    alive: list[Model | None] = []
    host_s: list[float] = []  # host seconds to launch one call
    with torch.no_grad():
        for model in models:
            try:
                host_s.append(_warm_up(model, sets, warmup))
                alive.append(model)
            except Exception:  # a model that fails is reported without a time, not a crash of the report
                host_s.append(math.nan)
                alive.append(None)
        times: list[list[float]] = [[] for _ in models]
        for turn in range(math.ceil(calls / burst)):
            order = range(len(models)) if turn % 2 == 0 else reversed(range(len(models)))
            for n in order:
                model = alive[n]
                if model is None:
                    continue
                count = min(burst, calls - turn * burst)
                try:
                    times[n] += _burst(model, sets, turn * burst, count,
                                       head_start_s=2 * host_s[n] * count if n in gpu_time else 0.0)
                except Exception:
                    alive[n] = None
    return [float(np.median(t)) if alive[n] is not None and t else math.nan for n, t in enumerate(times)]


def _warm_up(model: Model, sets: list[list[torch.Tensor]], calls: int) -> float:
    """Calls ``model`` ``calls`` times: the longest host time of one call, leaving out the first (lazy work)."""
    cuda = any(t.is_cuda for t in sets[0])
    host = []
    for k in range(calls):
        if cuda:
            torch.cuda.current_stream().synchronize()
        start = time.perf_counter()
        model(*sets[k % len(sets)])
        host.append(time.perf_counter() - start)
    return max(host[1:] or host or [0.0])


def _input_sets(inputs: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    sets = [list(inputs)]
    if any(t.is_cuda for t in inputs):
        set_bytes = sum(t.numel() * t.element_size() for t in inputs)
        copies = copies_past_l2(set_bytes, torch.cuda.get_device_properties(inputs[0].device).L2_cache_size)
        sets += [[t.clone() for t in inputs] for _ in range(min(copies, MAX_INPUT_SETS) - 1)]
    return sets


def _burst(model: Model, sets: list[list[torch.Tensor]], first: int, calls: int, *,
           head_start_s: float = 0.0) -> list[float]:
    """Seconds of each of ``calls`` back-to-back calls, rotating the input sets from ``first``; on cuda behind a
    GPU busy-wait of ``head_start_s`` (at most ``MAX_HEAD_START_S``)."""
    if not any(t.is_cuda for t in sets[0]):
        seconds = []
        for k in range(first, first + calls):
            start = time.perf_counter()
            model(*sets[k % len(sets)])
            seconds.append(time.perf_counter() - start)
        return seconds
    torch.cuda.current_stream().synchronize()
    if head_start_s > 0:
        torch.cuda._sleep(int(min(head_start_s, MAX_HEAD_START_S) * _gpu_cycles_per_s()))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    for k, (start, end) in enumerate(events, first):
        start.record()
        model(*sets[k % len(sets)])
        end.record()
    events[-1][1].synchronize()
    return [start.elapsed_time(end) * 1e-3 for start, end in events]


@functools.cache
def _gpu_cycles_per_s() -> float:
    """Cycles of ``torch.cuda._sleep`` (a busy-wait) per second on this GPU."""
    cycles = 2_000_000
    torch.cuda._sleep(cycles)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) * 1e-3)
