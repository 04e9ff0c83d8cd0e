"""A content-addressed artifact cache shared by the compilers.

Each artifact ``<sha256 of key><suffix>`` has a sidecar ``<artifact>.sha256`` holding the digest of its bytes, written
after it. An entry whose bytes do not match (truncated, replaced, or written before digests existed) is rebuilt, so
a broken cache is never taken for a failed compile. The cache folders are private (0700); the temporary build
folders a killed process leaves behind are removed by the next process that builds there. Within a process, a build
of an artifact another thread is building waits for that build and shares its result (``transforms.build.Ahead``
compiles candidates before they are asked for).
"""

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace
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
    have the temporary work directory stripped from them. While another thread builds the same artifact, this call
    waits for it and returns its result (``cached`` when it built).
    """
    start = time.perf_counter()
    digest = hashlib.sha256("\0".join(key).encode()).hexdigest()
    target = Path(cache_dir) / backend / f"{digest}{suffix}"
    if verified(target):
        return BuildResult(backend, artifact=str(target), seconds=time.perf_counter() - start, cached=True)
    with _flights_lock:
        flight, owner = _flights.get(target), target not in _flights
        if owner:
            flight = _flights[target] = Future()
    assert flight is not None
    if not owner:  # another thread builds it: its result, as a cached one
        shared = flight.result()
        return replace(shared, seconds=time.perf_counter() - start, cached=shared.ok)
    try:
        result = _build(backend, Path(cache_dir), target, produce, start)
        flight.set_result(result)
        return result
    except BaseException as e:
        flight.set_exception(e)
        raise
    finally:
        with _flights_lock:
            del _flights[target]


#: Artifacts a thread of this process is building, each with the result its waiters get.
_flights: dict[Path, "Future[BuildResult]"] = {}
_flights_lock = threading.Lock()


def _build(backend: str, cache_dir: Path, target: Path, produce: Callable[[Path], Path], start: float) -> BuildResult:
    folder = private_folder(cache_dir, backend)
    with tempfile.TemporaryDirectory(dir=folder, prefix=f"{_BUILD_PREFIX}{os.getpid()}-") as workdir:
        try:
            artifact = produce(Path(workdir))
        except CompileFailure as e:
            message = str(e).replace(workdir + os.sep, "").strip()[-MAX_MESSAGE:]
            return BuildResult(backend, error_kind=e.kind, error=message, seconds=time.perf_counter() - start)
        try:
            _store(Path(workdir), artifact, target)
        except OSError as e:
            return BuildResult(backend, error_kind="compile", error=f"cannot store the kernel in the cache "
                               f"{cache_dir}: {e.strerror or e}", seconds=time.perf_counter() - start)
    return BuildResult(backend, artifact=str(target), seconds=time.perf_counter() - start)


def _store(workdir: Path, artifact: Path, target: Path) -> None:
    """Move ``artifact`` to ``target``, then its digest beside it (a folder in the way is removed: the cache heals)."""
    sidecar = workdir / "artifact.sha256"
    sidecar.write_text(_file_digest(artifact))
    for path in (target, _sidecar(target)):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
    os.replace(artifact, target)
    os.replace(sidecar, _sidecar(target))


_BUILD_PREFIX = "build-"
_swept: set[Path] = set()


def _sidecar(artifact: Path) -> Path:
    return artifact.with_name(artifact.name + ".sha256")


def _file_digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def verified(artifact: str | Path) -> bool:
    """Whether ``artifact`` exists and its bytes match the digest stored beside it."""
    artifact = Path(artifact)
    try:
        return _sidecar(artifact).read_text().strip() == _file_digest(artifact)
    except (OSError, UnicodeDecodeError):
        return False


def private_folder(cache_dir: Path, backend: str) -> Path:
    """``cache_dir/backend``, both made (or narrowed to) owner-only; once per process, the build folders of processes
    that died (SIGKILL leaves ``TemporaryDirectory`` behind) are removed."""
    folder = cache_dir / backend
    for path in (cache_dir, folder):
        path.mkdir(mode=0o700, exist_ok=True, parents=path is cache_dir)
        if path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o077:
            path.chmod(0o700)
    if folder not in _swept:
        _swept.add(folder)
        for entry in folder.glob(f"{_BUILD_PREFIX}*"):
            pid = entry.name.removeprefix(_BUILD_PREFIX).split("-")[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(entry, ignore_errors=True)
    return folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
