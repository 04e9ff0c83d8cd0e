"""Builder: compile a batch of candidate sources in parallel, one BuildResult per source, in order (``build``), or
each as soon as it and those before it are done while the rest compile on (``build_each``); or ahead of need, on
threads of their own (``Ahead``), so that a later build finds them cached or joins their compile."""

from collections.abc import Callable, Iterable, Iterator, Sequence
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

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for future in [pool.submit(compile_one, source, cache_dir, timeout_s) for source in sources]:
            yield future.result()


def compile_one(source: Source, cache_dir: Path, timeout_s: float) -> BuildResult:
    """One source compiled (or found in the cache under ``cache_dir``); a failure is its BuildResult."""
    try:
        target = {"arch": source.arch} if source.arch else {}
        return COMPILERS[source.backend](source.code, cache_dir=cache_dir, options=source.options,
                                         timeout_s=timeout_s, **target)
    except OSError as e:  # e.g. the cache directory is not writable
        return BuildResult(source.backend, error_kind="compile", error=f"{type(e).__name__}: {e}")


class Ahead:
    """Compiles sources into the cache under ``cache_dir`` on ``jobs`` threads of its own, in the order given, before
    anything asks for them: a :func:`build` of the same source later finds it cached, or waits for its compile in
    flight (``transforms.compilers.cache``) instead of starting another. What is still queued when it closes is
    dropped; a compile under way runs to its end (NVRTC cannot be interrupted)."""

    def __init__(self, *, cache_dir: Path, jobs: int = 4, timeout_s: float = 60.0) -> None:
        self.cache_dir, self.timeout_s = cache_dir, timeout_s
        self.pool = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="compile-ahead")

    def submit(self, sources: Iterable[Source]) -> None:
        for source in sources:
            self.pool.submit(compile_one, source, self.cache_dir, self.timeout_s)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "Ahead":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
