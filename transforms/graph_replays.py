"""One forward captured as CUDA graphs, replayed with no copies where that is safe (``GraphReplays``).

A CUDA graph reads and writes the addresses it was captured on. The copying way (the one torch's CUDA graph
docs show) copies the caller's inputs into the graph's buffers and clones the outputs out: for a model whose input
is large (a 64 MB adjacency matrix) or whose kernels are few and fast, those copies are a sizable part of its time,
and eager and ``torch.compile`` pay neither. So:

* **A graph per input address set.** The first call with inputs at new addresses (and strides) captures a graph
  that reads the caller's tensors where they lie; a later call with inputs at the same addresses replays it. A
  caller that reuses its buffers, or whose tensors PyTorch's caching allocator puts where the last ones were,
  copies nothing in. At most ``limit`` such graphs, each in its own memory pool, together at most
  ``memory_share`` of the device's memory; past that, calls take the copying way.
* **Outputs handed out, not cloned,** as aliases of the graph's output buffers. A graph is replayed only while
  the caller holds none of them (nor any view of them: PyTorch counts the users of a storage); while it does,
  the call takes the copying way, so an output the caller kept is never overwritten.

``capture(run, inputs, pool)`` is injectable so the bookkeeping can be tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

Run = Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]
Capture = Callable[[Run, Sequence[torch.Tensor], object], tuple[Callable[[], None], list[torch.Tensor]]]

MAX_GRAPHS = 16  # graphs per input address set; calls past them take the copying way
MEMORY_SHARE = 1 / 16  # of the device's memory, at most, for their pools together
#: Captures of one graph tried before its failure stands: on an H200, 2 of 12 plans optimized and timed in one process
#: had a capture invalidated by something else (``bench/README.md``), which the same forward's next capture need not be.
CAPTURE_TRIES = 3


def _users(tensor: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


def cuda_capture(run: Run, inputs: Sequence[torch.Tensor], pool: object) -> tuple[Callable[[], None],
                                                                                   list[torch.Tensor]]:
    """``run(inputs)`` captured as one CUDA graph in memory pool ``pool``: (replay, its output tensors).

    Only this thread's calls can spoil the capture (``thread_local``, as inductor's CUDA graph trees capture), so a
    worker thread of the caller's that allocates or synchronizes meanwhile does not. A capture that fails raises, and
    leaves the caller's stream current and PyTorch's CUDA random generator usable (:func:`_after_failed_capture`)."""
    graph = torch.cuda.CUDAGraph()
    caller = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            outputs = run(inputs)
    except Exception:
        _after_failed_capture(caller)
        raise
    return graph.replay, outputs


def _after_failed_capture(caller: torch.cuda.Stream) -> None:
    """Undo what a failed ``torch.cuda.graph`` leaves behind: its capture stream current (its exit stops at the
    error before restoring the caller's), and the default generator still counting offsets for the graph (random
    draws made in the capture; the process's next draw outside a capture would raise "Offset increment outside graph
    capture encountered unexpectedly"). A capture that ends closes that count."""
    torch.cuda.set_stream(caller)
    closing = torch.cuda.CUDAGraph()
    with torch.cuda.graph(closing):
        torch.empty(1, device=caller.device).fill_(0.0)


@dataclass
class _Captured:
    replay: Callable[[], None]
    outputs: list[torch.Tensor]
    inputs: list[torch.Tensor] = field(default_factory=list)  # the copying way's buffers
    users: list[int] = field(default_factory=list)  # of each output's storage when the caller holds none

    def __post_init__(self) -> None:
        self.users = [_users(t) for t in self.outputs]

    def held(self) -> bool:
        return any(_users(t) != n for t, n in zip(self.outputs, self.users, strict=True))


class GraphReplays:
    """``run`` (a forward over a list of input tensors) captured and replayed as CUDA graphs (module docstring).
    ``forward(inputs)`` returns what ``run`` would; ``warm_up(inputs)`` runs before the first capture."""

    def __init__(self, run: Run, device: torch.device, *, warm_up: Callable[[Sequence[torch.Tensor]], None],
                 capture: Capture = cuda_capture, limit: int = MAX_GRAPHS, memory_share: float = MEMORY_SHARE,
                 pool: Callable[[], object] = torch.cuda.graph_pool_handle) -> None:
        self.run, self.device, self._warm_up, self._capture = run, device, warm_up, capture
        self.limit, self._pool = limit, pool
        self._memory_left = (memory_share * torch.cuda.get_device_properties(device).total_memory
                             if device.type == "cuda" else float("inf"))
        self._warm = False
        self.by_address: dict[tuple[tuple[int, tuple[int, ...]], ...], _Captured] = {}
        self.copying: _Captured | None = None

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        key = tuple((t.data_ptr(), t.stride()) for t in inputs)
        captured = self.by_address.get(key)
        if captured is None and len(self.by_address) < self.limit and self._memory_left > 0:
            captured = self.by_address[key] = self._new(inputs)
        if captured is not None and not captured.held():
            captured.replay()
            return [t.detach() for t in captured.outputs]
        if self.copying is None:
            buffers = [t.clone() for t in inputs]
            self.copying = self._new(buffers)
            self.copying.inputs = buffers
        for buffer, value in zip(self.copying.inputs, inputs, strict=True):
            buffer.copy_(value)
        self.copying.replay()
        return [t.clone() for t in self.copying.outputs]

    def _new(self, inputs: Sequence[torch.Tensor]) -> _Captured:
        if not self._warm:
            self._warm_up(inputs)
            self._warm = True
        before = torch.cuda.memory_reserved(self.device) if self.device.type == "cuda" else 0
        for attempt in range(CAPTURE_TRIES):
            try:
                replay, outputs = self._capture(self.run, inputs, self._pool())
                break
            except Exception:
                if attempt == CAPTURE_TRIES - 1:
                    raise
        if self.device.type == "cuda":
            self._memory_left -= torch.cuda.memory_reserved(self.device) - before
        return _Captured(replay, outputs)
