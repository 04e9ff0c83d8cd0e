"""Whole-model timing: models compared are timed in turn, so a drifting machine favours none of them."""

import itertools
import math
import time

import torch

from service.model_timing import compare
from tests.gpu import needs_gpu


def test_a_drifting_machine_favours_neither_of_two_identical_models() -> None:
    ticks = itertools.count()

    def drifting() -> None:  # each call slower than the one before, whichever model makes it
        time.sleep(1e-3 * (1 + next(ticks) / 10))

    a, b = (lambda x: drifting()), (lambda x: drifting())
    first, second = compare([a, b], [torch.ones(1)], calls=40, burst=2, warmup=1)
    # timed one after the other, the second model's calls would all come later: >= 2x slower
    assert abs(first - second) / first < 0.25


def test_a_failing_model_has_no_time_and_the_others_still_do() -> None:
    def broken(x: torch.Tensor) -> None:
        raise RuntimeError("no kernel")

    good, bad = compare([lambda x: x + 1, broken], [torch.ones(4)], calls=3)
    assert good > 0 and math.isnan(bad)


def _gpu_cycles_per_ms() -> float:
    cycles = 10_000_000
    torch.cuda._sleep(cycles)  # warm-up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / start.elapsed_time(end)


@needs_gpu
def test_a_call_costs_what_a_loop_pays_for_it_the_larger_of_its_host_and_gpu_time_or_its_gpu_time_when_asked() -> None:
    per_ms = _gpu_cycles_per_ms()

    def gpu_bound(x: torch.Tensor) -> None:  # 0.5 ms of host work before 2 ms on the GPU: a loop hides the host
        time.sleep(0.5e-3)
        torch.cuda._sleep(int(2 * per_ms))

    def host_bound(x: torch.Tensor) -> None:  # 2 ms of host work for 0.5 ms on the GPU: a loop waits on the host
        time.sleep(2e-3)
        torch.cuda._sleep(int(0.5 * per_ms))

    gpu_s, host_s, host_at_gpu_time_s = compare([gpu_bound, host_bound, host_bound], [torch.ones(1, device="cuda")],
                                                calls=40, gpu_time={2})
    # timed from an idle GPU, gpu_bound would cost 2.5 ms: its host time added to its GPU time
    assert 1.9e-3 < gpu_s < 2.25e-3
    assert host_s > 1.9e-3
    assert 0.45e-3 < host_at_gpu_time_s < 0.7e-3  # its launches queued ahead, it costs its GPU time
