"""PyTorch eager on a CUDA GPU, timed like generated kernels: CUDA-graph replay over input copies that
together exceed twice the L2 cache, behind the gate (``transforms.gate``), CUDA events, warm-up, median seconds per
call."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from transforms.gate import gate
from transforms.worker import copies_past_l2


def graph_replay_seconds(
    fn: Callable[[dict[str, Any]], Any], inputs: Mapping[str, np.ndarray], dtypes: Mapping[str, Any], *,
    repeats: int = 10, warmup: int = 3,
) -> float:
    """Median seconds of ``fn(tensors)``; replays a captured graph, or times plain calls where capture fails.
    NaN when torch has no GPU or ``fn`` fails."""
    try:
        import torch
    except ImportError:
        return math.nan
    if not torch.cuda.is_available():
        return math.nan
    first = {n: torch.as_tensor(v).to("cuda", dtypes[n]) for n, v in inputs.items()}
    set_bytes = 2 * sum(t.numel() * t.element_size() for t in first.values())  # inputs + outputs, roughly
    copies = copies_past_l2(set_bytes, torch.cuda.get_device_properties(0).L2_cache_size)
    sets = [first] + [{n: t.clone() for n, t in first.items()} for _ in range(copies - 1)]

    def all_copies() -> None:
        for tensors in sets:
            fn(tensors)

    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                all_copies()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            all_copies()
        step: Callable[[], None] = graph.replay
        gated = True
    except Exception:  # not capturable (host syncs, cpu tensors): time plain calls, which a gate would hold
        torch.cuda.synchronize()
        step, gated = all_copies, False
    try:
        for _ in range(warmup):
            step()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        stream = _cupy_stream(torch) if gated else None
        for _ in range(repeats):
            with gate(stream) if stream is not None else contextlib.nullcontext():
                start.record()
                step()
                end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3 / copies)
    except Exception:
        return math.nan
    return float(np.median(times))


def _cupy_stream(torch: Any) -> Any:
    """PyTorch's current stream as CuPy's, for the gate (``transforms.gate``) the worker times its candidates behind."""
    import cupy

    return cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
