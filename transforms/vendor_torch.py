"""Vendor convolutions and GEMMs through PyTorch for the worker's ``Launch.library`` entries
(``transforms.codegen.vendor`` makes the launches).

Each binding takes a :class:`~transforms.run.Launch` (buffers x / a, w / b, out, then named int64 scalars) and
returns the callable the worker calls. On cuda it is shaped like a CuPy kernel, ``call(grid, block, args,
shared_mem=0, stream=None)`` with CuPy arrays; on cpu, ``call(*args)`` with the data pointers (ctypes) and scalars
a cpu kernel gets. Either way PyTorch runs on the buffers themselves (``torch.as_tensor`` of a CuPy array, a NumPy
view of a pointer), writing its result into ``out`` (zero copy), on the caller's stream. TF32 stays off (the vendor
paths compute in the operands' float32 / float64) unless the launch's ``tf32`` scalar is 1 (a cuDNN convolution
under ``conv(cudnn,benchmark,tf32)``). Imports torch (and NumPy) only when a binding is made.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

from transforms.run import Launch, Scalar

Call = Callable[..., None]
_CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double}


def _scalars(launch: Launch) -> dict[str, int]:
    return {a.name: int(a.value) for a in launch.args if isinstance(a, Scalar)}


def _cpu_call(launch: Launch, run: Callable[[list[Any]], None]) -> Call:
    """A cpu binding: ``run(tensors)`` on tensors viewing the buffers the pointer arguments point to."""
    import numpy as np
    import torch

    buffers = launch.buffers
    cache: dict[tuple[int, ...], list[Any]] = {}

    def call(*args: Any) -> None:
        pointers = tuple(int(a.value) for a in args[:len(buffers)])
        tensors = cache.get(pointers)
        if tensors is None:
            tensors = [torch.from_numpy(np.ctypeslib.as_array((_CTYPES[b.dtype] * _numel(b.shape)).from_address(p)))
                       .view(b.shape) for b, p in zip(buffers, pointers, strict=True)]
            cache.clear()  # one set of buffers at a time: a plan binds new outputs per call
            cache[pointers] = tensors
        run(tensors)

    return call


def _cuda_call(launch: Launch, run: Callable[[list[Any]], None], flags: dict[str, bool | int] | None = None) -> Call:
    """A cuda binding: ``run(tensors)`` on the CuPy arrays as tensors, on the given stream."""
    import torch

    buffers = launch.buffers

    def call(grid: object, block: object, args: Sequence[Any], shared_mem: int = 0, stream: Any = None) -> None:
        tensors = [torch.as_tensor(a, device="cuda").view(b.shape) for a, b in zip(args, buffers, strict=False)]
        current = torch.cuda.current_stream()
        # a plan passes PyTorch's own current stream: run on it as it is (an ExternalStream of the default stream's
        # pointer, 0, is not ordered with it)
        external = current if stream is None or stream.ptr == current.cuda_stream else \
            torch.cuda.ExternalStream(stream.ptr)
        with torch.cuda.stream(external), torch.backends.cudnn.flags(enabled=True, allow_tf32=False, **(flags or {})):
            run(tensors)

    return call


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _conv(launch: Launch, cudnn: bool) -> Callable[[list[Any]], None]:
    import torch

    s = _scalars(launch)
    stride, padding = [s["stride_h"], s["stride_w"]], [s["pad_h"], s["pad_w"]]
    dilation, groups = [s["dil_h"], s["dil_w"]], s["groups"]

    def run(tensors: list[Any]) -> None:
        x, w, out = tensors
        shape = _conv_shape(x.shape, w.shape, stride, padding, dilation)
        if cudnn:
            torch.ops.aten.cudnn_convolution.out(x, w, padding, stride, dilation, groups, bool(s["benchmark"]),
                                                 False, bool(s.get("tf32", 0)), out=out.view(shape))
        else:  # aten.convolution.out takes a slow generic path (90 ms for a 7x7 depthwise conv on cpu): copy
            out.view(shape).copy_(torch.nn.functional.conv2d(x, w, None, stride, padding, dilation, groups))

    return run


def _conv_shape(x: Sequence[int], w: Sequence[int], stride: list[int], padding: list[int],
                dilation: list[int]) -> tuple[int, ...]:
    size = [(x[-2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1 for i in (0, 1)]
    return (*x[:-3], w[0], *size)


def torch_conv(launch: Launch, backend: str = "cuda") -> Call:
    """``conv2d`` (PyTorch's own choice of kernel: oneDNN on cpu; cuDNN or its own on cuda), copied into out."""
    run = _conv(launch, cudnn=False)
    return _cpu_call(launch, run) if backend == "cpu" else _cuda_call(launch, run, {"benchmark": False})


#: How many of its heuristic's best-ranked plans cuDNN's benchmark search times (PyTorch's default: 10). The search
#: runs once per shape in each process, the optimizing worker's and the plan's: in a process of its own it took
#: 0.005-1.25 s a shape on an H200 at the held-out models' convolutions (``bench/README.md``), the largest part of
#: optimizing a convolutional model, and the plans it times last are the ones the heuristic ranks lowest.
BENCHMARK_LIMIT = 4


def cudnn_conv(launch: Launch) -> Call:
    """``aten.cudnn_convolution`` into out, cuDNN's algorithm chosen by timing (benchmark 1: the best of the
    :data:`BENCHMARK_LIMIT` plans its heuristic ranks first) or its heuristic."""
    return _cuda_call(launch, _conv(launch, cudnn=True), {"benchmark_limit": BENCHMARK_LIMIT})


def warm_cudnn() -> None:
    """Import torch and load cuDNN on the GPU with one small convolution: what the first library convolution of a
    worker would otherwise pay (seconds) when it runs."""
    import torch

    x = torch.ones(1, 8, 8, 8, device="cuda")
    torch.nn.functional.conv2d(x, torch.ones(8, 8, 3, 3, device="cuda"))
    torch.cuda.synchronize()


def torch_matmul(launch: Launch, backend: str = "cpu") -> Call:
    """``torch.matmul`` (BLAS: MKL / OpenBLAS on cpu) of the strided operand views into out."""
    import torch

    s = _scalars(launch)
    batch = [s[f"batch{i}"] for i in range(len(s)) if f"batch{i}" in s]
    a_batch = [s[f"a_batch{i}"] for i in range(len(batch))]
    b_batch = [s[f"b_batch{i}"] for i in range(len(batch))]
    m, n, k = s["m"], s["n"], s["k"]

    def run(tensors: list[Any]) -> None:
        a, b, out = tensors
        a_view = a.reshape(-1).as_strided((*batch, m, k), (*a_batch, s["a_outer"], s["a_k"]))
        b_view = b.reshape(-1).as_strided((*batch, k, n), (*b_batch, s["b_k"], s["b_outer"]))
        torch.matmul(a_view, b_view, out=out.view(*batch, m, n))

    return _cpu_call(launch, run) if backend == "cpu" else _cuda_call(launch, run)
