"""The fewest seconds a generated cuda kernel can take, from its launches alone: a candidate whose bound is already
far over the fastest time known for its subgraph cannot be chosen, so it is neither compiled nor run.

Every thread of a launch is one lane, and no lane does more than :data:`LANE_FLOPS_PER_S`; a block runs on one
multiprocessor, which issues arithmetic on at most :data:`LANES_PER_BLOCK` lanes at a time however many threads the
block has. The subgraph's arithmetic (``embed.profile.work``) has to be done by the lanes of its launches, so the kernel
takes at least ``flops / (LANE_FLOPS_PER_S x the lanes of its widest launch)``, where a launch has ``min(threads, blocks
x LANES_PER_BLOCK)`` lanes. A random recipe that maps a convolution's reduction onto a few blocks of threads runs for
hundreds of milliseconds where cuDNN takes microseconds; the bound sees that before anything is compiled, and so it sees
a fused recipe whose whole convolution runs in one or two blocks (2.4 s on an H200 where cuDNN takes 20 us). Tensor-core
(mma) code and library launches do more per lane and get no bound.

Checked against recorded GPU times (``bench/launch_bound_check.py``, ``bench/results/launch_bound_check_s17.txt``):
over 57,308 kernels of an H100 recording and 2,807 of an H200 one, every kernel took at least 10 times its bound.
At 4x eager's time the bound leaves out 713 of the H100 recording's kernels, which took 240 of its 302 GPU seconds,
almost all random or fused recipes of convolutions.
"""

import math

from transforms.codegen import Kernel

#: Two fused multiply-adds (4 flops) a cycle at 3 GHz: more than any GPU's lane does at its boost clock, with packed
#: FP32 or half2 arithmetic.
LANE_FLOPS_PER_S = 12e9
#: FP32 lanes of one multiprocessor (4 x 32 on Ampere GA10x, Ada, Hopper and Blackwell; 64 on V100 and A100).
LANES_PER_BLOCK = 128
_TENSOR_CORE_CODE = ("mma.sync", "wmma")


def fewest_seconds(kernel: Kernel, flops: float) -> float | None:
    """The least time ``kernel`` (cuda) can take for ``flops`` of arithmetic, or None when it has a library launch
    or tensor-core code (no bound)."""
    if any(launch.library for launch in kernel.launches) or any(c in kernel.code for c in _TENSOR_CORE_CODE):
        return None
    lanes = max(min(math.prod(launch.grid) * math.prod(launch.block), math.prod(launch.grid) * LANES_PER_BLOCK)
                for launch in kernel.launches)
    return flops / (LANE_FLOPS_PER_S * max(lanes, 1))
