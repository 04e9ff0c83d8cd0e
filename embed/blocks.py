"""Work on large arrays in fixed blocks on threads: NumPy releases the GIL in its loops (random draws,
conversions, ufuncs), so blocks of a million elements run in parallel, and fixed blocks make the result
independent of the thread count.

    out = np.empty(n, np.float16); blockwise(n, lambda lo, hi: out.__setitem__(slice(lo, hi), x[lo:hi]))
"""

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

BLOCK = 1 << 20  # elements per block


def blockwise(size: int, work: Callable[[int, int], None]) -> None:
    """``work(start, stop)`` for each block of ``range(size)`` (in :data:`BLOCK` steps), on up to one thread a core."""
    starts = range(0, size, BLOCK)
    if len(starts) <= 1:
        work(0, size)
        return
    with ThreadPoolExecutor(max_workers=min(len(starts), os.cpu_count() or 1)) as pool:
        list(pool.map(lambda lo: work(lo, min(lo + BLOCK, size)), starts))


def converted(array: Any, convert: Callable[[Any], Any], dtype: object, xp: Any = np) -> Any:
    """``convert(array)`` computed into a new array of ``dtype`` (``convert`` must be elementwise): block by block on
    threads for NumPy; at once on the device for another array module ``xp`` (CuPy)."""
    if xp is not np:
        return xp.ascontiguousarray(convert(array), dtype=dtype)
    flat = np.ascontiguousarray(array).reshape(-1)
    out = np.empty(flat.size, dtype)

    def work(lo: int, hi: int) -> None:
        out[lo:hi] = convert(flat[lo:hi])

    blockwise(flat.size, work)
    return out.reshape(array.shape)
