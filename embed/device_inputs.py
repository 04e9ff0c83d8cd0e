"""The last step of drawing random float inputs on the GPU (``embed.inputs`` with CuPy) in one kernel of one module.

Done with CuPy's own routines, the rule, the rounding to the input's dtype and the replacement of exact zeros took
about ten element-wise, comparison and masked-assignment kernels, each compiled by NVRTC at its first use on a machine
(about 0.2 s apiece, then cached on disk): seconds of a first optimize on a fresh machine. This module is compiled once
per process (from CuPy's disk cache after the first), and its kernel makes one pass over the draws.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

_SOURCE = r"""
#define EACH(i, n) for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); \
                             i += (long long)gridDim.x * blockDim.x)

template <typename T> __device__ T ruled(T raw, int positive, T spread) {
    return positive ? (T)0.5 + (T)1.5 * raw : raw / spread;
}

// out[i] = the rule applied to raw[i] (0.5 + 1.5 u for a positive input, else z / spread), in T, exact zeros -> 0.5.
template <typename T>
__global__ void finish(const T* raw, T* out, long long n, int positive, T spread) {
    EACH(i, n) {
        const T value = ruled(raw[i], positive, spread);
        out[i] = value == (T)0 ? (T)0.5 : value;
    }
}

// The same from float draws into float16 bits, rounded to nearest even.
__global__ void finish_half(const float* raw, unsigned short* out, long long n, int positive, float spread) {
    EACH(i, n) {
        unsigned short bits;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(ruled(raw[i], positive, spread)));
        out[i] = (bits & 0x7fff) == 0 ? (unsigned short)0x3800 : bits;  // +-0 -> 0.5
    }
}

// The same from float draws into float values that bfloat16 holds exactly, rounded to nearest even.
__global__ void finish_bfloat16(const float* raw, float* out, long long n, int positive, float spread) {
    EACH(i, n) {
        const unsigned int bits = __float_as_uint(ruled(raw[i], positive, spread));
        const float value = __uint_as_float((bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u);
        out[i] = value == 0.0f ? 0.5f : value;
    }
}
"""
_THREADS = 256
_BLOCKS = 4096


@functools.cache
def _kernels() -> dict[str, Any]:
    """The module's kernels by name, its one compile done on first use in this process."""
    import cupy as cp

    names = ["finish<float>", "finish<double>", "finish_half", "finish_bfloat16"]
    module = cp.RawModule(code=_SOURCE, options=("--fmad=false",), name_expressions=names)  # rounded as NumPy rounds
    return {name: module.get_function(name) for name in names}


def warm() -> None:
    """Compile the module now, not in the first draw (once a process; on a fresh machine an NVRTC compile)."""
    _kernels()


def finish(out: Any, raw: Any, *, positive: bool, spread: float, bfloat16: bool = False) -> None:
    """Fill the CuPy array ``out`` (float64, float32 or float16; float32 holding bfloat16 values with ``bfloat16``)
    from the CuPy draws ``raw`` (float64 for a float64 ``out``, else float32; uniform in [0, 1) for a ``positive``
    input, else standard normal): ``0.5 + 1.5 * raw`` or ``raw / spread``, computed in the draws' dtype, rounded to
    ``out``'s, exact zeros replaced by 0.5 (``embed.inputs``'s rule)."""
    kind = np.float64 if out.dtype == np.float64 else np.float32
    if raw.dtype != kind or raw.shape != out.shape or (bfloat16 and out.dtype != np.float32):
        raise ValueError(f"cannot finish {out.dtype} {out.shape} from {raw.dtype} {raw.shape} draws")
    name, target = {np.float64: "finish<double>", np.float32: "finish<float>"}[kind], out
    if out.dtype == np.float16:
        name, target = "finish_half", out.view(np.uint16)
    elif bfloat16:
        name = "finish_bfloat16"
    blocks = max(1, min(_BLOCKS, -(-out.size // _THREADS)))
    _kernels()[name]((blocks,), (_THREADS,), (raw, target, np.int64(out.size), np.int32(positive), kind(spread)))
