"""The output check's sums on the GPU in two kernels of one CUDA module (``transforms.worker.check`` with CuPy arrays).

Checked with CuPy's own element-wise and reduction routines, one output took about a dozen kernels, each compiled by
NVRTC at its first use on a machine (about 0.2 s apiece, then cached on disk): the first optimize on a fresh machine
spent most of its worker's time compiling them. This module is compiled once per process from CuPy's disk cache, and
its two kernels make one pass each over the output and its reference, with one copy back to the host.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

_SOURCE = r"""
#define EACH(i, n) for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); \
                             i += (long long)gridDim.x * blockDim.x)

// Largest finite |ref| and the worst gap kept as the bits of a non-negative double, whose order as unsigned integers
// is its order as numbers: an atomicMax on the bits is a max on the values.
__device__ void keep_largest(unsigned long long* at, double value) {
    for (int offset = 16; offset > 0; offset /= 2)
        value = fmax(value, __shfl_down_sync(0xffffffff, value, offset));
    if (threadIdx.x % 32 == 0) atomicMax(at, (unsigned long long)__double_as_longlong(value));
}

__device__ void add_up(unsigned long long* at, unsigned long long value) {
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_down_sync(0xffffffff, value, offset);
    if (threadIdx.x % 32 == 0 && value) atomicAdd(at, value);
}

// tally[0]: the largest |ref_i| over elements where both are finite (as double bits).
template <typename T>
__global__ void largest_magnitude(const T* out, const T* ref, long long n, unsigned long long* tally) {
    double largest = 0.0;
    EACH(i, n)
        if (isfinite(out[i]) && isfinite(ref[i])) largest = fmax(largest, (double)fabs(ref[i]));
    keep_largest(tally, largest);
}

// tally[1]: the worst |out_i - ref_i| / max(|ref_i|, floor) over elements where both are finite, computed in T;
// tally[2]: elements where either is not finite and out_i != ref_i (NaN != NaN); tally[3]: those with out_i not finite.
template <typename T>
__global__ void gaps(const T* out, const T* ref, long long n, double floor_fraction, double normal,
                     unsigned long long* tally) {
    const T floor = (T)fmax(floor_fraction * __longlong_as_double((long long)tally[0]), normal);
    double worst = 0.0;
    unsigned long long mismatched = 0, bad_output = 0;
    EACH(i, n) {
        const T o = out[i], r = ref[i];
        if (isfinite(o) && isfinite(r)) {
            const T gap = fabs(o - r) / fmax(fabs(r), floor);
            worst = fmax(worst, (double)gap);
        } else if (o != r) {
            mismatched += 1;
            bad_output += !isfinite(o);
        }
    }
    keep_largest(tally + 1, worst);
    add_up(tally + 2, mismatched);
    add_up(tally + 3, bad_output);
}
"""
_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_THREADS = 256
_BLOCKS = 1024  # grid-stride: enough blocks to fill any current GPU, few enough atomics


@functools.cache
def _kernels() -> dict[str, Any]:
    """The module's kernels by name (``gaps<float>``, ...), its one compile done on first use in this process."""
    import cupy as cp

    names = [f"{kernel}<{t}>" for kernel in ("largest_magnitude", "gaps") for t in _TYPES.values()]
    module = cp.RawModule(code=_SOURCE, name_expressions=names)
    return {name: module.get_function(name) for name in names}


def warm() -> None:
    """Compile the module's kernels now, not in the first check (once a process; on a fresh machine a compile)."""
    _kernels()


def tally(output: Any, reference: Any, floor_fraction: float, normal: float) -> tuple[float, int, int]:
    """``transforms.worker.tally`` of a CuPy ``output`` and its CuPy ``reference`` (same shape), computed in the
    reference's dtype when both are float32 or both float64, else in float64."""
    import cupy as cp

    if output.dtype != reference.dtype or reference.dtype not in _TYPES:
        output, reference = output.astype(np.float64), reference.astype(np.float64)
    output, reference = cp.ascontiguousarray(output), cp.ascontiguousarray(reference)
    kernels, kind = _kernels(), _TYPES[reference.dtype]
    sums = cp.zeros(4, dtype=cp.uint64)
    n = np.int64(output.size)
    blocks = max(1, min(_BLOCKS, -(-output.size // _THREADS)))
    kernels[f"largest_magnitude<{kind}>"]((blocks,), (_THREADS,), (output, reference, n, sums))
    kernels[f"gaps<{kind}>"]((blocks,), (_THREADS,),
                             (output, reference, n, np.float64(floor_fraction), np.float64(normal), sums))
    host = sums.get()
    return float(host[1:2].view(np.float64)[0]), int(host[2]), int(host[3])
