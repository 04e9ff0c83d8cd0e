"""Builder: compile a batch of candidate sources in parallel, one BuildResult per source, in order (``build``), or
each as soon as it and those before it are done while the rest compile on (``build_each``)."""

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from transforms.compilers import cpu, cuda
from transforms.results import BuildResult

COMPILERS: dict[str, Callable[..., BuildResult]] = {"cpu": cpu.compile_c, "cuda": cuda.compile_cuda}


@dataclass(frozen=True)
class Source:
    """One candidate to compile: source text for ``backend`` ("cpu": C, "cuda": CUDA C++), extra flags and (cuda)
    the target ``arch`` (``compute_XY``: PTX, ``sm_XY``: a cubin; "": the compiler's default)."""

    code: str
    backend: str = "cpu"
    options: tuple[str, ...] = ()
    arch: str = ""

    def __post_init__(self) -> None:
        if self.backend not in COMPILERS:
            raise ValueError(f"unknown backend {self.backend!r}; choose one of: {', '.join(sorted(COMPILERS))}")


def build(sources: Sequence[Source], *, cache_dir: Path, jobs: int = 4, timeout_s: float = 60.0) -> list[BuildResult]:
    """Compile ``sources`` with ``jobs`` threads; each compile is bounded by ``timeout_s``.

    Compiler processes (cc, nvcc) run in parallel and are killed at the timeout; NVRTC compiles run in parallel
    too (8 tensor-core GEMM kernels: 4x faster on 8 threads than on one, on an H200 machine) but cannot be
    interrupted. A failure is a BuildResult with ``error_kind`` "compile" or "timeout"; nothing is raised for a
    bad source.
    """
    return list(build_each(sources, cache_dir=cache_dir, jobs=jobs, timeout_s=timeout_s))


def build_each(sources: Sequence[Source], *, cache_dir: Path, jobs: int = 4, timeout_s: float = 60.0) \
        -> Iterator[BuildResult]:
    """:func:`build`'s results one by one, in order: each as soon as it is compiled, the later sources compiling on
    meanwhile (all of them are submitted at once), so a caller can run the first while the others compile."""

    def one(source: Source) -> BuildResult:
        try:
            target = {"arch": source.arch} if source.arch else {}
            return COMPILERS[source.backend](
                source.code, cache_dir=cache_dir, options=source.options, timeout_s=timeout_s, **target
            )
        except OSError as e:  # e.g. the cache directory is not writable
            return BuildResult(source.backend, error_kind="compile", error=f"{type(e).__name__}: {e}")

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for future in [pool.submit(one, source) for source in sources]:
            yield future.result()
