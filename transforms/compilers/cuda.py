"""CUDA C++ -> PTX with NVRTC (through CuPy's low-level bindings; no GPU needed) or nvcc, cached on disk.

NVRTC runs in the calling process and holds the GIL, so its compiles cannot be interrupted: ``timeout_s``
bounds nvcc only. ``load`` needs a GPU.
"""

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from transforms.compilers.cache import CompileFailure, cached_build, run_tool, tool_version
from transforms.results import BuildResult

DEFAULT_ARCH = "compute_90"
Compiler = Literal["auto", "nvrtc", "nvcc"]


@functools.cache
def _nvrtc() -> Any | None:
    """CuPy's NVRTC bindings when the library loads, else None."""
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception:  # ImportError, or the shared library is missing
        return None
    return nvrtc


@functools.cache
def toolchain_id(compiler: Literal["nvrtc", "nvcc"]) -> str | None:
    """The version string a cached PTX depends on, or None when that compiler is missing."""
    if compiler == "nvrtc":
        nvrtc = _nvrtc()
        return None if nvrtc is None else "nvrtc {}.{}".format(*nvrtc.getVersion())
    version = tool_version("nvcc")
    return None if version is None else version.splitlines()[-1]


def available(compiler: Compiler = "auto") -> bool:
    """Whether ``compile_cuda(..., compiler=compiler)`` has a compiler to use."""
    if compiler == "auto":
        return any(toolchain_id(c) is not None for c in ("nvrtc", "nvcc"))
    return toolchain_id(compiler) is not None


def _nvrtc_compile(code: str, options: list[str], workdir: Path) -> Path:
    nvrtc = _nvrtc()
    program = nvrtc.createProgram(code, "kernel.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(program, options)
        except nvrtc.NVRTCError as e:
            raise CompileFailure("compile", nvrtc.getProgramLog(program) or str(e)) from None
        ptx = nvrtc.getPTX(program)
    finally:
        nvrtc.destroyProgram(program)
    (workdir / "kernel.ptx").write_bytes(ptx.rstrip(b"\0"))
    return workdir / "kernel.ptx"


def compile_cuda(
    code: str,
    *,
    cache_dir: Path,
    options: Sequence[str] = (),
    timeout_s: float = 60.0,
    arch: str = DEFAULT_ARCH,
    compiler: Compiler = "auto",
) -> BuildResult:
    """Compile ``code`` to PTX for ``arch`` into ``cache_dir/cuda/<sha256>.ptx``.

    ``compiler="auto"`` uses NVRTC when CuPy and its NVRTC library load, else nvcc. Kernels meant to be
    looked up by name should be declared ``extern "C"``.
    """
    chosen = ("nvrtc" if toolchain_id("nvrtc") else "nvcc") if compiler == "auto" else compiler
    flags = [f"-arch={arch}", *options]

    def produce(workdir: Path) -> Path:
        if toolchain_id(chosen) is None:
            raise CompileFailure("compile", f"{chosen} is not available; install cupy-cuda13x and nvidia-cuda-nvrtc")
        if chosen == "nvrtc":
            return _nvrtc_compile(code, flags, workdir)
        (workdir / "kernel.cu").write_text(code)
        run_tool(["nvcc", "-ptx", *flags, "-o", str(workdir / "kernel.ptx"), str(workdir / "kernel.cu")],
                 timeout_s=timeout_s)
        return workdir / "kernel.ptx"

    key = (code, " ".join(flags), chosen, toolchain_id(chosen) or "missing")
    return cached_build(backend="cuda", cache_dir=cache_dir, key=key, suffix=".ptx", produce=produce)


def load(artifact: str) -> Any:
    """Load a PTX file into a ``cupy.RawModule`` (needs a GPU)."""
    import cupy

    return cupy.RawModule(path=str(artifact))
