"""cuBLAS and cuBLASLt GEMMs for the worker's ``Launch.library`` entries, called through ctypes.

Each binding takes a :class:`~transforms.run.Launch` (buffers, then named int64 scalars; see
``transforms.codegen.cuda_gemm``) and returns a callable shaped like a CuPy kernel, ``call(grid, block, args,
shared_mem=0, stream=None)``. The matrices are column-major in the libraries' terms: the row-major product
``C = A B`` runs as ``C^T = B^T A^T``. Both run on a handle of their own (one per library and process) with
a fixed, zeroed workspace per binding (what other algorithms leave in a workspace cannot reach this one), so
that a call can be captured into a CUDA graph (CuPy's wrappers refuse capture; capture allows no allocation).

``cublaslt_matmul`` asks ``cublasLtMatmulAlgoGetHeuristic`` for up to :data:`LT_HEURISTICS` algorithms and
runs the one of rank ``algo``; its ``epilogue`` (``cublasLtEpilogue_t``) may add a bias vector along the
rows of D (the row-major n dimension) and apply relu or tanh-gelu before D is written in its own dtype.
Imports only the standard library and (when a binding is made) CuPy and ``cuda.pathfinder``.
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from transforms.run import Launch, Scalar

WORKSPACE_BYTES = 32 << 20
LT_HEURISTICS = 32  # algorithms asked of the heuristic; a launch's ``algo`` is a rank among them
COMPUTE_64F, CUDA_R_32F, CUDA_R_64F, GEMM_DEFAULT = 70, 0, 1, -1  # cublasComputeType_t, cudaDataType_t, algo
#: cublasLt attribute enums: matmul descriptor, matrix layout, preference.
_TRANSA, _TRANSB, _EPILOGUE, _BIAS_POINTER = 3, 4, 7, 8
_BATCH_COUNT, _BATCH_STRIDE = 5, 6
_MAX_WORKSPACE = 1

GemmCall = Callable[..., None]
_c_int, _c_i64, _c_u64, _ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p


class _Heuristic(ctypes.Structure):
    """``cublasLtMatmulHeuristicResult_t``."""

    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


@functools.cache
def _library(name: str) -> ctypes.CDLL:
    from cuda.pathfinder import load_nvidia_dynamic_lib

    return ctypes.CDLL(load_nvidia_dynamic_lib(name).abs_path)


def _workspace() -> Any:
    import cupy

    workspace = cupy.zeros(WORKSPACE_BYTES, cupy.uint8)
    cupy.cuda.Device().synchronize()  # zeroed before any stream uses it
    return workspace


def _check(status: int, what: str) -> None:
    if status:
        raise RuntimeError(f"{what} failed with cuBLAS status {status}")


@functools.cache
def _handle(library: str, create: str) -> ctypes.c_void_p:
    handle = _ptr()
    _check(getattr(_library(library), create)(ctypes.byref(handle)), create)
    return handle


def _scalars(launch: Launch) -> dict[str, int]:
    return {a.name: int(a.value) for a in launch.args if isinstance(a, Scalar)}


def _pointers(launch: Launch, args: Sequence[Any]) -> list[ctypes.c_void_p]:
    """Device pointers of the launch's buffers (they come first in ``args``)."""
    return [_ptr(x.data.ptr) for x in args[:len(launch.buffers)]]


def cublas_gemm(launch: Launch) -> GemmCall:
    """``cublasGemmStridedBatchedEx`` (default algorithm) on buffers A, B, C with scalars trans_a, m, n, k, lda,
    ldb, ldc, stride_a, stride_b, stride_c, batch, type_a, type_b, type_c, compute, and trans_b where B is read
    transposed (absent: 0)."""
    lib, s = _library("cublas"), _scalars(launch)
    handle = _handle("cublas", "cublasCreate_v2")
    workspace = _workspace()
    scale = ctypes.c_double if s["compute"] == COMPUTE_64F else ctypes.c_float
    alpha, beta = scale(1.0), scale(0.0)

    def call(grid: object, block: object, args: Sequence[Any], shared_mem: int = 0, stream: Any = None) -> None:
        a, b, c = _pointers(launch, args)
        _check(lib.cublasSetStream_v2(handle, _ptr(stream.ptr)), "cublasSetStream")
        _check(lib.cublasSetWorkspace_v2(handle, _ptr(workspace.data.ptr), ctypes.c_size_t(workspace.nbytes)),
               "cublasSetWorkspace")
        _check(lib.cublasGemmStridedBatchedEx(
            handle, _c_int(s["trans_a"]), _c_int(s.get("trans_b", 0)), _c_int(s["m"]), _c_int(s["n"]), _c_int(s["k"]),
            ctypes.byref(alpha), a, _c_int(s["type_a"]), _c_int(s["lda"]), _c_i64(s["stride_a"]),
            b, _c_int(s["type_b"]), _c_int(s["ldb"]), _c_i64(s["stride_b"]), ctypes.byref(beta),
            c, _c_int(s["type_c"]), _c_int(s["ldc"]), _c_i64(s["stride_c"]), _c_int(s["batch"]),
            _c_int(s["compute"]), _c_int(GEMM_DEFAULT),
        ), "cublasGemmStridedBatchedEx")

    return call


def cublaslt_matmul(launch: Launch) -> GemmCall:
    """``cublasLtMatmul`` with the heuristic's algorithm of rank ``algo`` on buffers A, B, C (written as D, in
    place) and the bias vector when ``bias`` is 1, with the scalars of :func:`cublas_gemm` plus epilogue, bias and
    algo. RuntimeError when the heuristic offers fewer than ``algo + 1`` algorithms. The call's descriptors are
    freed when the call is (``call.destroyed``)."""
    lib, s = _library("cublasLt"), _scalars(launch)
    handle = _handle("cublasLt", "cublasLtCreate")
    workspace = _workspace()
    double = s["compute"] == COMPUTE_64F
    scale = ctypes.c_double if double else ctypes.c_float
    alpha, beta = scale(1.0), scale(0.0)

    def set_attribute(setter: str, target: ctypes.c_void_p, attribute: int, value: Any) -> None:
        size = ctypes.c_size_t(ctypes.sizeof(value))
        _check(getattr(lib, setter)(target, _c_int(attribute), ctypes.byref(value), size), setter)

    desc, layouts = _ptr(), []
    _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _c_int(s["compute"]),
                                        _c_int(CUDA_R_64F if double else CUDA_R_32F)), "cublasLtMatmulDescCreate")

    def layout(dtype: int, rows: int, cols: int, ld: int, stride: int) -> ctypes.c_void_p:
        made = _ptr()
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(made), _c_int(dtype), _c_u64(rows), _c_u64(cols),
                                              _c_i64(ld)), "cublasLtMatrixLayoutCreate")
        layouts.append(made)
        set_attribute("cublasLtMatrixLayoutSetAttribute", made, _BATCH_COUNT, ctypes.c_int32(s["batch"]))
        set_attribute("cublasLtMatrixLayoutSetAttribute", made, _BATCH_STRIDE, _c_i64(stride))
        return made

    def algorithm() -> Any:
        """The heuristic's algorithm of rank ``algo`` for these descriptors."""
        preference = _ptr()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(preference)), "cublasLtMatmulPreferenceCreate")
        try:
            set_attribute("cublasLtMatmulPreferenceSetAttribute", preference, _MAX_WORKSPACE,
                          _c_u64(workspace.nbytes))
            found, count = (_Heuristic * LT_HEURISTICS)(), _c_int()
            _check(lib.cublasLtMatmulAlgoGetHeuristic(handle, desc, layout_a, layout_b, layout_d, layout_d,
                                                      preference, _c_int(LT_HEURISTICS), found,
                                                      ctypes.byref(count)), "cublasLtMatmulAlgoGetHeuristic")
        finally:
            lib.cublasLtMatmulPreferenceDestroy(preference)
        if s["algo"] >= count.value:
            raise RuntimeError(f"cuBLASLt offers {count.value} algorithms for this matmul, none of rank {s['algo']}")
        return found[s["algo"]]

    m, n, k, trans_b = s["m"], s["n"], s["k"], s.get("trans_b", 0)
    a_rows, a_cols = (k, m) if s["trans_a"] else (m, k)
    b_rows, b_cols = (n, k) if trans_b else (k, n)
    try:
        set_attribute("cublasLtMatmulDescSetAttribute", desc, _TRANSA, ctypes.c_int32(s["trans_a"]))
        set_attribute("cublasLtMatmulDescSetAttribute", desc, _TRANSB, ctypes.c_int32(trans_b))
        set_attribute("cublasLtMatmulDescSetAttribute", desc, _EPILOGUE, ctypes.c_uint32(s["epilogue"]))
        layout_a = layout(s["type_a"], a_rows, a_cols, s["lda"], s["stride_a"])
        layout_b = layout(s["type_b"], b_rows, b_cols, s["ldb"], s["stride_b"])
        layout_d = layout(s["type_c"], m, n, s["ldc"], s["stride_c"])
        if s["bias"]:  # the heuristic may look at the bias pointer's alignment: any 256-byte aligned one will do
            set_attribute("cublasLtMatmulDescSetAttribute", desc, _BIAS_POINTER, _ptr(workspace.data.ptr))
        chosen = algorithm()
    except BaseException:
        _destroy_lt(lib, desc, layouts)
        raise

    def call(grid: object, block: object, args: Sequence[Any], shared_mem: int = 0, stream: Any = None) -> None:
        a, b, d, *bias = _pointers(launch, args)
        if bias:  # each buffer copy of a timing graph has its own bias vector
            set_attribute("cublasLtMatmulDescSetAttribute", desc, _BIAS_POINTER, bias[0])
        _check(lib.cublasLtMatmul(
            handle, desc, ctypes.byref(alpha), a, layout_a, b, layout_b, ctypes.byref(beta), d, layout_d, d, layout_d,
            ctypes.byref(chosen.algo), _ptr(workspace.data.ptr), ctypes.c_size_t(workspace.nbytes),
            _ptr(stream.ptr),
        ), "cublasLtMatmul")

    call.destroyed = weakref.finalize(call, _destroy_lt, lib, desc, layouts)  # type: ignore[attr-defined]
    return call


def _destroy_lt(lib: ctypes.CDLL, desc: ctypes.c_void_p, layouts: list[ctypes.c_void_p]) -> None:
    """Free a binding's cuBLASLt matmul descriptor and matrix layouts."""
    for layout in layouts:
        lib.cublasLtMatrixLayoutDestroy(layout)
    lib.cublasLtMatmulDescDestroy(desc)
