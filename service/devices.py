"""The device kernels are timed on: identity, class and measured peaks (memory bandwidth, flop rate).

cpu: a NumPy copy of 256 MiB and a float32 matmul (BLAS, all cores). cuda: a PyTorch device-to-device copy of
1 GiB and an fp16 matmul, with the SM count and L2 size from the device properties.
"""

import functools
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from embed.profile import DeviceSpec


def _best_seconds(fn: Callable[[], object], repeats: int, sync: Callable[[], None] = lambda: None) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def _cpu_l2_bytes() -> int:
    """The last-level cache size from sysfs (0 when unknown)."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        factor = {"K": 2**10, "M": 2**20}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KM")) * factor)
    return max(sizes, default=0)


def cpu_device(*, repeats: int = 3) -> DeviceSpec:
    """This machine's cpu, with its bandwidth and peak measured now."""
    n = 32 * 2**20  # 32 Mi float64 = 256 MiB
    src, dst = np.ones(n), np.empty(n)
    copy_s = _best_seconds(lambda: np.copyto(dst, src), repeats)
    a = np.ones((1024, 1024), dtype=np.float32)
    matmul_s = _best_seconds(lambda: a @ a, repeats)
    model = _cpu_model() or platform.machine()
    return DeviceSpec(
        name=f"cpu:{model}", device_class=f"cpu:{platform.machine()}", arch=platform.machine(),
        bandwidth_gbps=2 * src.nbytes / copy_s / 1e9, peak_gflops=2 * 1024**3 / matmul_s / 1e9,
        compute_units=os.cpu_count() or 1, l2_bytes=_cpu_l2_bytes(),
    )


def cuda_device(*, repeats: int = 5) -> DeviceSpec:
    """GPU 0, with its bandwidth and fp16 peak measured now (needs a GPU PyTorch can see). Measured with PyTorch, whose
    kernels are compiled ahead: CuPy's fill and copy compile at first use (0.3-0.45 s on a machine's first optimize)."""
    import torch

    props = torch.cuda.get_device_properties(0)
    bandwidth_gbps, peak_gflops = _cuda_peaks(repeats)
    torch.cuda.empty_cache()  # the 2.3 GiB measured on go back to the device
    arch = f"sm_{props.major}{props.minor}"
    return DeviceSpec(
        name=f"cuda:{props.name}", device_class=f"cuda:{arch}", arch=arch, bandwidth_gbps=bandwidth_gbps,
        peak_gflops=peak_gflops, compute_units=props.multi_processor_count, l2_bytes=props.L2_cache_size,
    )


def _cuda_peaks(repeats: int) -> tuple[float, float]:
    """(GB/s of a device-to-device copy of 1 GiB, GFLOP/s of an 8192^3 fp16 matmul) on GPU 0."""
    import torch

    src = torch.ones(2**27, dtype=torch.float64, device="cuda")
    dst = torch.empty_like(src)
    copy_s = _best_seconds(lambda: dst.copy_(src), repeats, torch.cuda.synchronize)
    a = torch.ones((8192, 8192), dtype=torch.float16, device="cuda")
    matmul_s = _best_seconds(lambda: a @ a, repeats, torch.cuda.synchronize)
    return 2 * src.numel() * src.element_size() / copy_s / 1e9, 2 * 8192**3 / matmul_s / 1e9


@functools.cache
def detect_device(backend: str) -> DeviceSpec:
    """The device of ``backend`` ("cpu" or "cuda"), peaks measured: once a process (the measurements took 0.3-0.7 s
    of each optimize on the 2-core cpu machine)."""
    if backend == "cpu":
        return cpu_device()
    if backend == "cuda":
        return cuda_device()
    raise ValueError(f"unknown backend {backend!r}; choose cpu or cuda")


def toolchain(backend: str) -> str:
    """What measurements on ``backend`` are keyed by besides subgraph, recipe and device: the compilers, and the
    generation of tunebank's code generator (``transforms.codegen.CODEGEN_VERSION``)."""
    from transforms import codegen

    if backend == "cpu":
        from transforms.compilers.cpu import toolchain_id

        compilers = toolchain_id()
    else:
        from transforms.compilers.cuda import toolchain_id as cuda_toolchain

        compilers = " ".join(t for t in (cuda_toolchain("nvrtc"), cuda_toolchain("nvcc")) if t) or "cuda"
    return f"{compilers} codegen {codegen.CODEGEN_VERSION}"
