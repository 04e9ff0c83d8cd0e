"""CUDA C++ -> PTX (a virtual ``compute_XY`` arch) or a cubin (a real ``sm_XY`` one) with NVRTC (through CuPy's
low-level bindings; no GPU needed) or nvcc, cached on disk.

A cubin for the GPU that will run it (:func:`device_arch`) saves the driver's PTX compile when the module loads
(about 36 ms a kernel on an H200); PTX runs on any later GPU. NVRTC runs in the calling process; CuPy's binding
releases the GIL while it compiles, so compiles on threads overlap (``bench/results/compile_probe_h200.json``), but
they cannot be interrupted: ``timeout_s`` bounds nvcc only. ``load`` needs a GPU.
"""

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from transforms.compilers.cache import CompileFailure, cached_build, run_tool, tool_version, verified
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


@functools.cache
def device_arch() -> str:
    """``sm_XY`` of the first visible GPU when NVRTC can compile for it, else :data:`DEFAULT_ARCH` (PTX, which the
    driver compiles for any later GPU)."""
    nvrtc = _nvrtc()
    try:
        import cupy

        capability = int(cupy.cuda.Device(0).compute_capability)
    except Exception:  # no CuPy, no driver, no GPU
        return DEFAULT_ARCH
    return f"sm_{capability}" if nvrtc is not None and capability in nvrtc.getSupportedArchs() else DEFAULT_ARCH


def _suffix(arch: str) -> str:
    return ".cubin" if arch.startswith("sm_") else ".ptx"


def _nvrtc_compile(code: str, options: list[str], workdir: Path, suffix: str) -> Path:
    nvrtc = _nvrtc()
    program = nvrtc.createProgram(code, "kernel.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(program, options)
        except nvrtc.NVRTCError as e:
            raise CompileFailure("compile", nvrtc.getProgramLog(program) or str(e)) from None
        binary = nvrtc.getCUBIN(program) if suffix == ".cubin" else nvrtc.getPTX(program).rstrip(b"\0")
    finally:
        nvrtc.destroyProgram(program)
    (workdir / f"kernel{suffix}").write_bytes(binary)
    return workdir / f"kernel{suffix}"


def compile_cuda(
    code: str,
    *,
    cache_dir: Path,
    options: Sequence[str] = (),
    timeout_s: float = 60.0,
    arch: str = DEFAULT_ARCH,
    compiler: Compiler = "auto",
) -> BuildResult:
    """Compile ``code`` for ``arch`` into ``cache_dir/cuda/<sha256>.ptx`` (virtual arch) or ``.cubin`` (real).

    ``compiler="auto"`` uses NVRTC when CuPy and its NVRTC library load, else nvcc. Kernels meant to be
    looked up by name should be declared ``extern "C"``.
    """
    chosen = ("nvrtc" if toolchain_id("nvrtc") else "nvcc") if compiler == "auto" else compiler
    flags, suffix = [f"-arch={arch}", *options], _suffix(arch)

    def produce(workdir: Path) -> Path:
        if toolchain_id(chosen) is None:
            raise CompileFailure("compile", f"{chosen} is not available; install cupy-cuda13x and nvidia-cuda-nvrtc")
        if chosen == "nvrtc":
            return _nvrtc_compile(code, flags, workdir, suffix)
        (workdir / "kernel.cu").write_text(code)
        run_tool(["nvcc", "-cubin" if suffix == ".cubin" else "-ptx", *flags, "-o", str(workdir / f"kernel{suffix}"),
                  str(workdir / "kernel.cu")], timeout_s=timeout_s)
        return workdir / f"kernel{suffix}"

    key = (code, " ".join(flags), chosen, toolchain_id(chosen) or "missing")
    return cached_build(backend="cuda", cache_dir=cache_dir, key=key, suffix=suffix, produce=produce)


def load(artifact: str) -> Any:
    """Load a PTX or cubin file into a ``cupy.RawModule`` (needs a GPU) once its bytes match the cache's digest."""
    import cupy

    if not verified(artifact):
        raise OSError(f"{Path(artifact).name} does not match the digest it was cached with")
    return cupy.RawModule(path=str(artifact))
