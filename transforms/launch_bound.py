"""The fewest seconds a generated cuda kernel can take, from its launches alone: a candidate whose bound is already
far over the fastest time known for its subgraph cannot be chosen, so it is neither compiled nor run.

Every thread of a launch is one lane, and no lane does more than :data:`LANE_FLOPS_PER_S`; the subgraph's
arithmetic (``embed.profile.work``) has to be done by the lanes of its launches, so the kernel takes at least
``flops / (LANE_FLOPS_PER_S x the threads of its widest launch)``. A random recipe that maps a convolution's
reduction onto a few blocks of threads runs for hundreds of milliseconds where cuDNN takes microseconds; the bound
sees that before anything is compiled. Tensor-core (mma) code and library launches do more per lane and get no bound.

Checked against recorded GPU times (``bench/launch_bound_check.py``, ``bench/results/launch_bound_check_s16.txt``):
over 57,308 kernels of an H100 recording and 2,807 of an H200 one, every kernel took at least 16 times its bound
(5.5 times with the bound taken at a third of this rate). At 4x eager's time the bound leaves out 438 of the H100
recording's kernels, which took 143 of its 302 GPU seconds, almost all random recipes of convolutions.
"""

import math

from transforms.codegen import Kernel

#: Two fused multiply-adds (4 flops) a cycle at 3 GHz: more than any GPU's lane does at its boost clock, with packed
#: FP32 or half2 arithmetic.
LANE_FLOPS_PER_S = 12e9
_TENSOR_CORE_CODE = ("mma.sync", "wmma")


def fewest_seconds(kernel: Kernel, flops: float) -> float | None:
    """The least time ``kernel`` (cuda) can take for ``flops`` of arithmetic, or None when it has a library launch
    or tensor-core code (no bound)."""
    if any(launch.library for launch in kernel.launches) or any(c in kernel.code for c in _TENSOR_CORE_CODE):
        return None
    threads = max(math.prod(launch.grid) * math.prod(launch.block) for launch in kernel.launches)
    return flops / (LANE_FLOPS_PER_S * max(threads, 1))
