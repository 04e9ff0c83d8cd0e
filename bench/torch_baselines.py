"""The baselines tunebank is compared with on a CUDA GPU, all timed by ``graph_replay_seconds`` (CUDA-graph
replay over input copies past L2; plain calls where a function cannot be captured, which ``captures`` reports):

* eager PyTorch and ``torch.compile`` (Inductor) of ``embed.eager.run_eager`` on a graph, with the wall time of
  the compiling first call;
* SpMM libraries on one CSR: ``torch.sparse`` (CSR tensor @ dense) and cuSPARSE through CuPy, both as
  ``cupyx.scipy.sparse.csr_matrix @ dense`` (which converts the dense operand to column-major and allocates a
  zeroed column-major output each call) and as ``cupyx.cusparse.spmm`` on a dense operand already column-major
  into a preallocated output (the cuSPARSE call alone). CuPy runs on PyTorch's current stream, as plain calls.
  ``torch.sparse`` calls cuSPARSE SpMM too, on the row-major dense operand.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from embed.eager import TORCH_DTYPES, run_eager
from embed.ir import Graph
from transforms.eager_cuda import graph_replay_seconds

Fn = Callable[[dict[str, Any]], Any]
COMPILE_MODES = {"default": "default", "max-autotune": "max-autotune-no-cudagraphs"}


def dtypes_of(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    return {n: TORCH_DTYPES[graph.tensors[n].dtype] for n in inputs}


def captures(fn: Fn, inputs: Mapping[str, np.ndarray], dtypes: Mapping[str, Any]) -> bool:
    """Whether ``fn`` can be captured in a CUDA graph (else ``graph_replay_seconds`` times plain calls)."""
    import torch

    tensors = {n: torch.as_tensor(v).to("cuda", dtypes[n]) for n, v in inputs.items()}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            fn(tensors)
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            fn(tensors)
    except Exception:
        torch.cuda.synchronize()
        return False
    return True


def timed(fn: Fn, inputs: Mapping[str, np.ndarray], dtypes: Mapping[str, Any], repeats: int) -> dict[str, Any]:
    """``{"s": median seconds, "captured": bool}``, or ``{"error": ...}`` when ``fn`` fails."""
    try:
        captured = captures(fn, inputs, dtypes)
        return {"s": graph_replay_seconds(fn, inputs, dtypes, repeats=repeats), "captured": captured}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


def eager(graph: Graph, inputs: Mapping[str, np.ndarray], repeats: int) -> dict[str, Any]:
    return timed(lambda t: run_eager(graph, t), inputs, dtypes_of(graph, inputs), repeats)


def warm_up_compiler() -> float:
    """Compile and run a tiny function once: the process-wide start-up of Inductor (imports, the compile worker
    pool), kept out of the first case's compile time. Returns its wall seconds."""
    import torch

    started = time.perf_counter()
    torch.compile(lambda x: torch.nn.functional.gelu(x) * 2)(torch.ones(64, device="cuda"))
    torch.cuda.synchronize()
    return time.perf_counter() - started


def compiled(graph: Graph, inputs: Mapping[str, np.ndarray], mode: str, repeats: int) -> dict[str, Any]:
    """``torch.compile(run_eager on graph, mode=COMPILE_MODES[mode])``: ``compile_s`` (the first call, which
    compiles, wall clock) and the replayed time of the compiled function."""
    import torch

    torch._dynamo.reset()
    dtypes = dtypes_of(graph, inputs)
    fn = torch.compile(lambda t: run_eager(graph, t), mode=COMPILE_MODES[mode], dynamic=False)
    first = {n: torch.as_tensor(v).to("cuda", dtypes[n]) for n, v in inputs.items()}
    torch.cuda.synchronize()
    started = time.perf_counter()
    try:
        fn(first)
        torch.cuda.synchronize()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return {"compile_s": time.perf_counter() - started, **timed(fn, inputs, dtypes, repeats)}


def _cupy_csr(t: dict[str, Any], n: int) -> Any:
    import cupy
    import cupyx.scipy.sparse as cusp

    a = cusp.csr_matrix((cupy.asarray(t["values"]), cupy.asarray(t["indices"]), cupy.asarray(t["indptr"])),
                        shape=(n, n))
    a.has_canonical_format = True  # the benchmark CSRs are sorted and distinct; skips a check that syncs
    return a


def _on_torch_stream() -> Any:
    """A context manager: CuPy's and cuSPARSE's stream set to PyTorch's current stream, so that PyTorch's events
    time CuPy's work. CuPy calls are not captured: CuPy's memory pool cannot allocate inside PyTorch's graph
    capture, so under capture this raises at once and ``graph_replay_seconds`` times plain calls instead."""
    import cupy
    import torch
    from cupy_backends.cuda.libs import cusparse as libcusparse

    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("CuPy calls are timed as plain calls")
    stream = cupy.cuda.Stream.from_external(torch.cuda.current_stream())
    libcusparse.setStream(cupy.cuda.device.get_cusparse_handle(), stream.ptr)
    return stream


def cupyx_matmul(n: int) -> Fn:
    """``cupyx.scipy.sparse.csr_matrix @ dense`` as a user calls it."""
    import cupy

    def fn(t: dict[str, Any]) -> Any:
        with _on_torch_stream():
            return _cupy_csr(t, n) @ cupy.asarray(t["dense"])

    return fn


def cusparse_spmm(n: int) -> Fn:
    """``cupyx.cusparse.spmm`` with the dense operand (input ``dense_f``, column-major) and the output ``out_f``
    given: the cuSPARSE SpMM call alone."""
    import cupy
    from cupyx import cusparse

    def fn(t: dict[str, Any]) -> Any:
        with _on_torch_stream():
            # torch holds the column-major arrays as their row-major transposes; .T views them as F-ordered
            b, c = cupy.asarray(t["dense_t"]).T, cupy.asarray(t["out_t"]).T
            return cusparse.spmm(_cupy_csr(t, n), b, c=c)

    return fn


def torch_sparse(n: int) -> Fn:
    """``torch.sparse_csr_tensor(...) @ dense`` (cuSPARSE inside PyTorch)."""
    import torch

    def fn(t: dict[str, Any]) -> Any:
        return torch.sparse_csr_tensor(t["indptr"], t["indices"], t["values"], size=(n, n)) @ t["dense"]

    return fn


def rel_error(fn: Fn, inputs: Mapping[str, np.ndarray], dtypes: Mapping[str, Any], ref: np.ndarray) -> float:
    """max |out - ref| / max |ref| of one call of ``fn`` (a column-major result is read back as such)."""
    import torch

    out = fn({n: torch.as_tensor(v).to("cuda", dtypes[n]) for n, v in inputs.items()})
    out = np.asarray(out.get() if hasattr(out, "get") else out.cpu().numpy(), dtype=np.float64)
    return float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))


def spmm_libraries(inputs: Mapping[str, np.ndarray], ref: np.ndarray, repeats: int) -> dict[str, dict[str, Any]]:
    """torch.sparse, cupyx ``csr @ dense`` and the cuSPARSE SpMM alone on the inputs of ``spmm_graphs``:
    per library ``s`` (median seconds), ``captured``, ``rel_err`` (against ``ref``), or ``error``."""
    import torch

    n = len(inputs["indptr"]) - 1
    base = {k: inputs[k] for k in ("indptr", "indices", "values")}
    dtypes = {"indptr": torch.int32, "indices": torch.int32, "values": torch.float32, "dense": torch.float32,
              "dense_t": torch.float32, "out_t": torch.float32}
    column_major = {**base, "dense_t": np.ascontiguousarray(inputs["dense"].T),
                    "out_t": np.zeros(inputs["dense"].shape[::-1], np.float32)}
    plans = {"torch.sparse": (torch_sparse(n), {**base, "dense": inputs["dense"]}),
             "cupyx csr@dense": (cupyx_matmul(n), {**base, "dense": inputs["dense"]}),
             "cusparse spmm (col-major B)": (cusparse_spmm(n), column_major)}
    out: dict[str, dict[str, Any]] = {}
    for name, (fn, data) in plans.items():
        try:
            before = rel_error(fn, data, dtypes, ref)
            row = timed(fn, data, dtypes, repeats)
            row["rel_err"] = max(before, rel_error(fn, data, dtypes, ref))  # checked before and after timing
        except Exception as e:
            row = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        out[name] = row
    return out

