"""C source -> shared library with the system C compiler, cached on disk, loaded with ctypes."""

import ctypes
import functools
import platform
from collections.abc import Sequence
from pathlib import Path

from transforms.compilers.cache import CompileFailure, cached_build, run_tool, tool_version, verified
from transforms.results import BuildResult

DEFAULT_FLAGS: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")


@functools.cache
def toolchain_id(compiler: str = "cc") -> str:
    """What a cached library depends on besides its source: compiler version, machine and CPU model."""
    version = tool_version(compiler) or "missing"
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        model = next((line for line in cpuinfo.splitlines() if line.startswith("model name")), "")
    except OSError:
        model = platform.processor()
    return f"{version}|{platform.machine()}|{model}"


def compile_c(
    code: str,
    *,
    cache_dir: Path,
    options: Sequence[str] = (),
    timeout_s: float = 60.0,
    compiler: str = "cc",
) -> BuildResult:
    """Compile ``code`` with ``compiler DEFAULT_FLAGS options`` into ``cache_dir/cpu/<sha256>.so``."""
    argv = [compiler, *DEFAULT_FLAGS, *options]

    def produce(workdir: Path) -> Path:
        if toolchain_id(compiler).startswith("missing"):
            raise CompileFailure("compile", f"C compiler {compiler!r} not found; install gcc or clang")
        (workdir / "kernel.c").write_text(code)
        run_tool([*argv, "-o", str(workdir / "kernel.so"), str(workdir / "kernel.c"), "-lm"], timeout_s=timeout_s)
        return workdir / "kernel.so"

    key = (code, " ".join(argv), toolchain_id(compiler))
    return cached_build(backend="cpu", cache_dir=cache_dir, key=key, suffix=".so", produce=produce)


def load(artifact: str) -> ctypes.CDLL:
    """Load a compiled library (kernels are looked up on it by symbol name) once its bytes match the cache's digest:
    a library replaced after it was built is never run."""
    if not verified(artifact):
        raise OSError(f"{Path(artifact).name} does not match the digest it was cached with")
    return ctypes.CDLL(str(Path(artifact).resolve()))
