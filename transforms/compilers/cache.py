"""A content-addressed artifact cache shared by the compilers."""

import hashlib
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from transforms.results import BuildResult, ErrorKind

MAX_MESSAGE = 4000


class CompileFailure(Exception):
    """Raised by a producer; turned into a failed BuildResult by :func:`cached_build`."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def cached_build(
    *,
    backend: str,
    cache_dir: Path,
    key: Sequence[str],
    suffix: str,
    produce: Callable[[Path], Path],
) -> BuildResult:
    """Return the cached artifact for ``key`` or call ``produce(workdir) -> artifact`` and store its output.

    The artifact is ``cache_dir/<backend>/<sha256 of key><suffix>``, written atomically. Compiler messages
    have the temporary work directory stripped from them.
    """
    start = time.perf_counter()
    digest = hashlib.sha256("\0".join(key).encode()).hexdigest()
    target = Path(cache_dir) / backend / f"{digest}{suffix}"
    if target.exists():
        return BuildResult(backend, artifact=str(target), seconds=time.perf_counter() - start, cached=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as workdir:
        try:
            os.replace(produce(Path(workdir)), target)
        except CompileFailure as e:
            message = str(e).replace(workdir + os.sep, "").strip()[-MAX_MESSAGE:]
            return BuildResult(backend, error_kind=e.kind, error=message, seconds=time.perf_counter() - start)
    return BuildResult(backend, artifact=str(target), seconds=time.perf_counter() - start)


def run_tool(argv: Sequence[str], *, timeout_s: float) -> None:
    """Run a compiler command; a non-zero exit, a missing tool or a timeout raises CompileFailure."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise CompileFailure("compile", f"compiler {argv[0]!r} not found") from None
    except subprocess.TimeoutExpired:
        raise CompileFailure("timeout", f"{argv[0]} took longer than {timeout_s:g} s") from None
    if proc.returncode != 0:
        raise CompileFailure("compile", proc.stderr or proc.stdout or f"{argv[0]} exited with {proc.returncode}")


def tool_version(tool: str) -> str | None:
    """``tool --version`` output, or None when the tool is missing or fails."""
    try:
        proc = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None
