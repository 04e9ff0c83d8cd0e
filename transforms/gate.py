"""A gate in front of a CUDA timing: a one-thread kernel that holds a stream until the host has queued the events
and the work they bracket, so the GPU runs them back to back and the events time the work alone, not the host.

Queued on an idle stream, a start event is recorded at once and the work starts when its launch arrives: whatever
holds the host between the two calls (another thread holding the interpreter, e.g. an import: a 55 us GEMM timed at
316 us beside torch's import, ``bench/README.md``, twenty-third session) is timed as the work's. Behind the gate the
events and the work wait on the GPU until the host opens it (a flag in mapped host memory), after it queued them all.
The gate opens itself after :data:`LIMIT_NS` (a host that never opens it: the work then runs, timed as before).

    with gate(stream):
        start.record(stream); graph.launch(stream); end.record(stream)
    end.synchronize()
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator
from typing import Any

import numpy as np

#: The longest a gate holds its stream (nanoseconds of the GPU's global timer).
LIMIT_NS = 5_000_000_000

# spins on a volatile load of the flag until it is not 0 or the limit has passed since the kernel started
_PTX = """
.version 7.0
.target sm_70
.address_size 64
.visible .entry tb_gate(.param .u64 flag, .param .u64 limit)
{
    .reg .pred %open, %waiting;
    .reg .b32 %value;
    .reg .b64 %address, %limit, %start, %now, %waited;
    ld.param.u64 %address, [flag];
    ld.param.u64 %limit, [limit];
    mov.u64 %start, %globaltimer;
SPIN:
    ld.volatile.global.u32 %value, [%address];
    setp.ne.u32 %open, %value, 0;
    @%open bra DONE;
    mov.u64 %now, %globaltimer;
    sub.u64 %waited, %now, %start;
    setp.lt.u64 %waiting, %waited, %limit;
    @%waiting bra SPIN;
DONE:
    ret;
}
"""


class Gate:
    """One flag in mapped host memory (the device reads the host's pointer: unified addressing) and the kernel that
    waits on it, loaded in the current CUDA context."""

    def __init__(self) -> None:
        import cupy

        self.pointer = cupy.cuda.runtime.hostAlloc(4, cupy.cuda.runtime.hostAllocMapped)
        self.flag = ctypes.c_int32.from_address(self.pointer)
        self.flag.value = 1  # open until a timing closes it
        self.module = cupy.cuda.function.Module()
        self.module.load(_PTX.encode())
        self.kernel = self.module.get_function("tb_gate")

    @contextlib.contextmanager
    def closed(self, stream: Any) -> Iterator[None]:
        """Hold ``stream`` (a CuPy stream) while the body queues work on it; open when the body ends."""
        self.flag.value = 0
        self.kernel((1,), (1,), (np.uint64(self.pointer), np.uint64(LIMIT_NS)), stream=stream)
        try:
            yield
        finally:
            self.flag.value = 1


@functools.cache
def _process_gate() -> Gate:
    return Gate()


def gate(stream: Any) -> contextlib.AbstractContextManager[None]:
    """The process's gate (made on first use, in the current CUDA context), closed on ``stream`` (a CuPy stream)
    while the ``with`` body queues on it. Queue nothing behind it that loads a kernel or synchronizes on the host (a
    library routine's first call, cuDNN's benchmark search): that waits for the gate, which waits for the host."""
    return _process_gate().closed(stream)
