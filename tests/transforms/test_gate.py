"""The gate in front of CUDA timings (``transforms.gate``): what holds the host between a start event and the work it
times is not timed, and a gate nobody opens opens itself."""

import contextlib
import time

import numpy as np

from tests.gpu import needs_gpu

ADD_ONE = r'extern "C" __global__ void add_one(float* x) { x[threadIdx.x] += 1.0f; }'


@needs_gpu
def test_what_holds_the_host_between_the_start_event_and_the_launch_is_timed_only_without_the_gate() -> None:
    import cupy as cp

    from transforms.gate import gate

    stream = cp.cuda.Stream(non_blocking=True)
    kernel = cp.RawKernel(ADD_ONE, "add_one")
    x = cp.zeros(32, cp.float32)
    kernel((1,), (32,), (x,), stream=stream)  # loaded before any timing
    stream.synchronize()

    def timed(gated: bool) -> float:
        start, end = cp.cuda.Event(), cp.cuda.Event()
        with gate(stream) if gated else contextlib.nullcontext():
            start.record(stream)
            time.sleep(0.02)  # the host held between the event and the launch, as another thread holding it would
            kernel((1,), (32,), (x,), stream=stream)
            end.record(stream)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) * 1e-3

    assert timed(gated=False) > 0.015
    started = time.perf_counter()
    assert timed(gated=True) < 0.001  # a one-block kernel: microseconds
    assert time.perf_counter() - started < 1.0  # opened by the host, not by its 5 s limit
    assert np.all(cp.asnumpy(x) == 3)  # each launch ran once


@needs_gpu
def test_a_gate_nobody_opens_opens_itself_after_its_limit() -> None:
    import cupy as cp

    from transforms.gate import Gate

    closed = Gate()
    closed.flag.value = 0
    stream = cp.cuda.Stream(non_blocking=True)
    started = time.perf_counter()
    closed.kernel((1,), (1,), (np.uint64(closed.pointer), np.uint64(50_000_000)), stream=stream)  # 50 ms
    stream.synchronize()
    assert 0.04 < time.perf_counter() - started < 2.0
