"""C source -> shared library with the system C compiler, cached on disk, loaded with ctypes."""

import ctypes
import functools
import hashlib
import platform
from collections.abc import Sequence
from pathlib import Path

from transforms.compilers.cache import CompileFailure, cached_build, run_tool, tool_version, verified
from transforms.results import BuildResult

CODEGEN_FLAGS: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp")  # the flags that change what a kernel runs
DEFAULT_FLAGS: tuple[str, ...] = (*CODEGEN_FLAGS, "-shared", "-fPIC")
MAX_TOOLCHAIN_ID = 160  # the database's toolchain columns hold 200 characters


@functools.cache
def toolchain_id(compiler: str = "cc") -> str:
    """What a cached library and a measurement depend on besides the source, short and stable:
    ``<first line of compiler --version>|<codegen flags>|<machine>|<CPU model>``, e.g.
    ``cc (Debian 12.2.0-14+deb12u1) 12.2.0|-O3 -march=native -fopenmp|x86_64|AMD EPYC``. An id longer than
    :data:`MAX_TOOLCHAIN_ID` keeps its beginning and ends in a digest of the whole, so it stays distinct."""
    version = (tool_version(compiler) or "").strip()
    return _compose(version.splitlines()[0] if version else "missing", platform.machine(), _cpu_model())


def from_recorded(toolchain: str) -> str:
    """A cpu toolchain id in the long form recordings made before the short one hold (``cc --version`` in full,
    ``|machine|model name\t: CPU``) as :func:`toolchain_id` gives it today; any other id as it is."""
    version, sep, rest = toolchain.partition("|")
    if "\n" not in version or not sep:
        return toolchain
    machine, _, model = rest.partition("|")
    return _compose(version.splitlines()[0], machine, model.partition(":")[2] if model.startswith("model name")
                    else model)


def _compose(version_line: str, machine: str, cpu_model: str) -> str:
    full = "|".join((" ".join(version_line.split()), " ".join(CODEGEN_FLAGS), machine, " ".join(cpu_model.split())))
    if len(full) <= MAX_TOOLCHAIN_ID:
        return full
    return f"{full[:MAX_TOOLCHAIN_ID - 17]}#{hashlib.sha256(full.encode()).hexdigest()[:16]}"


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next((line.partition(":")[2] for line in lines if line.startswith("model name")), "")
    except OSError:
        model = platform.processor()
    return model


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
