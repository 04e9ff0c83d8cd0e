"""A CUDA source of small grid-stride kernels, compiled once per process with CuPy (from its disk cache after the
first compile on a machine), for the work on device arrays that CuPy's own routines would spread over many kernels,
each an NVRTC compile at its first use (``embed.device_inputs``, ``transforms.device_check``).

    names = ("scale<float>",)
    kernels(GRID_STRIDE + source, names)["scale<float>"]((blocks,), (threads,), (x, n))
"""

from __future__ import annotations

import functools
from typing import Any

#: ``EACH(i, n) { ... }``: a loop over ``[0, n)`` shared by every thread of the grid, for a kernel launched with a
#: fixed number of blocks whatever ``n``.
GRID_STRIDE = r"""
#define EACH(i, n) for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); \
                             i += (long long)gridDim.x * blockDim.x)
"""


@functools.cache
def kernels(source: str, names: tuple[str, ...], options: tuple[str, ...] = ()) -> dict[str, Any]:
    """The kernels ``names`` (name expressions: ``gaps<float>``, ``finish_half``) of ``source`` by name; the
    source is compiled on the first call in this process."""
    import cupy as cp

    module = cp.RawModule(code=source, options=options, name_expressions=list(names))
    return {name: module.get_function(name) for name in names}
