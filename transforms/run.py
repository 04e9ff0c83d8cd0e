"""Runner: validate and time built candidates one at a time in a worker subprocess.

The contract between code generation and the runner:

- :class:`Launch`: the entry symbol, its arguments in order (:class:`Buffer` or :class:`Scalar`) and, for
  CUDA, grid / block / dynamic shared memory (above 48 KB the worker raises the kernel's limit), or a
  ``library`` routine the worker runs on the arguments instead of a kernel (cuda: ``cublas_gemm`` and
  ``cublaslt_matmul`` of ``transforms.vendor_blas``). A cpu kernel is called as ``entry(arg0, arg1, ...)`` with
  buffers passed as pointers.
- :class:`Problem`: input arrays by buffer name (fresh random values chosen by the caller, or arrays already in
  the buffer dtype's storage form (:func:`to_storage`); values are converted to the buffer dtype, so compute the
  reference from :func:`quantize`-d inputs) and reference outputs by output-buffer name (float64, or float32
  where the tolerance is far above float32 rounding), plus optional per-output tolerances. A problem made from a
  spec (``Problem.described``, ``transforms.problem``) is built by the cuda worker itself, on its GPU.
- :class:`Trial`: a :class:`~transforms.results.BuildResult` + a sequence of Launches (one kernel per fused
  group, run in order on the same buffers) + a Problem.

Validation: output buffers are filled with NaN (ints: their minimum) before the first call; each output
is compared with its reference (in the reference's float dtype, where the output lives: on the device for cuda,
whose worker uploads a problem's inputs and references once, or builds them there from the problem's spec, and
gives each trial fresh device copies of the inputs) by relative error
``max_i |out_i - ref_i| / max(|ref_i|, floor)``, the floor the larger of ``1e-3 * max_j |ref_j|`` and the output
dtype's smallest normal (``worker.FLOOR_FRACTION``), which must not exceed the tolerance
(:data:`TOLERANCE` by dtype unless the Problem overrides it). A non-finite output where the reference is
finite is error kind "nan"; NaN never passes; validation covers the whole launch sequence. Timing of the
whole sequence: ``warmup`` calls, then ``repeats`` calls timed one by one (fewer, at least 3, once they have
taken a second: ``worker.TIMING_BUDGET_S``), or, for a candidate far slower than the fastest known
(:data:`SLOWER_FACTOR`), its one timed call; the result keeps median, IQR, min and the count.
cpu: ``time.perf_counter_ns``. cuda: the sequence is captured ``copies`` times into one CUDA graph, each
copy on its own set of buffers, with enough copies that together they exceed twice the L2 cache (so every
replay reads from device memory); each replay is timed with CUDA events and divided by ``copies``.

Data travels as JSON lines over pipes and ``.npz`` files (loaded without pickle); a cuda trial of a problem with
a spec sends the spec (JSON) instead. Standard library and NumPy only: this module is on the GPU measurement path.
"""

import atexit
import contextlib
import json
import math
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

import numpy as np

from transforms.results import BuildResult, RunResult

#: Relative-error tolerance by output dtype (integers must match exactly). fp32 accumulates rounding over
#: long reductions, fp16 has an 11-bit and bf16 an 8-bit significand.
TOLERANCE: dict[str, float] = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}

#: Buffer dtype -> NumPy storage dtype. bfloat16 is stored as its raw 16 bits.
STORAGE: dict[str, str] = {
    "float64": "float64", "float32": "float32", "float16": "float16", "bfloat16": "uint16",
    "int64": "int64", "int32": "int32", "int16": "int16", "int8": "int8", "uint8": "uint8",
}
SCALAR_DTYPES = ("float64", "float32", "int64", "int32")
CLOSE_TIMEOUT_S = 1.0  # a closing worker gets this long to exit by itself before it is killed
KEPT_PROBLEMS = 4  # saved problems a Worker keeps (see Worker.problem_file)
#: What a spare worker loads while it waits to be adopted (``transforms.worker.LOADS``): CuPy's modules, the problem
#: builder and torch, but no CUDA context (:class:`_Spare`).
SPARE_LOADS = ("cupy", "problems", "torch")
#: A candidate whose first timed call (wall clock, launch included) takes longer than SLOWER_FACTOR times the
#: fastest median of the batch so far, and at least SLOWER_FLOOR_S, is not timed further: that call is its time.
#: On cuda the call that was checked is the first timed call of generated kernels (loaded before it), so such a
#: candidate runs once in all; a library routine, whose first call may do work once, and a cpu kernel are called
#: again.
SLOWER_FACTOR = 4.0
SLOWER_FLOOR_S = 1e-3
T = TypeVar("T")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ROOT = Path(__file__).resolve().parents[1]


def to_storage(values: Any, dtype: str, xp: Any = np) -> Any:
    """``values`` converted to the storage array of ``dtype`` in array module ``xp`` (NumPy, or CuPy: converted on
    the GPU; bfloat16: round to nearest even, as bits); an array already in that storage form is returned as it
    is."""
    values = xp.asarray(values)
    if dtype != "bfloat16" or values.dtype == np.uint16:
        return xp.ascontiguousarray(values, dtype=STORAGE[dtype])
    bits = xp.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return xp.where(xp.isnan(values.astype(np.float32, copy=False)), 0x7FC0, rounded).astype(np.uint16)


def to_float(stored: Any, dtype: str, float_dtype: Any = np.float64) -> Any:
    """A storage array of ``dtype`` (NumPy or CuPy) as values of ``float_dtype``."""
    if dtype == "bfloat16":
        return (stored.astype(np.uint32) << 16).view(np.float32).astype(float_dtype, copy=False)
    return stored.astype(float_dtype, copy=False)


def quantize(values: Any, dtype: str) -> np.ndarray:
    """``values`` rounded to ``dtype`` and returned as float64: compute references from these."""
    return to_float(to_storage(values, dtype), dtype)


def poison(dtype: str) -> tuple[str, int | float]:
    """(storage dtype, value) that marks an unwritten element of ``dtype``: NaN, integers their minimum."""
    if dtype == "bfloat16":
        return "uint16", 0x7FC0
    storage = np.dtype(STORAGE[dtype])
    return STORAGE[dtype], float("nan") if storage.kind == "f" else int(np.iinfo(storage).min)


def poisoned(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """A storage array filled with :func:`poison`."""
    storage, value = poison(dtype)
    return np.full(shape, value, storage)


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise ValueError(f"invalid argument name {name!r}: use a C identifier")


@dataclass(frozen=True)
class Buffer:
    """An array argument. ``kind``: input (from the Problem), output (poisoned, validated) or scratch (poisoned: a
    kernel writes it before it reads it)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: Literal["input", "output", "scratch"] = "input"

    def __post_init__(self) -> None:
        _check_name(self.name)
        if self.dtype not in STORAGE:
            raise ValueError(f"unknown buffer dtype {self.dtype!r}; choose one of: {', '.join(STORAGE)}")
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))


@dataclass(frozen=True)
class Scalar:
    """A scalar argument passed by value."""

    name: str
    value: int | float
    dtype: str = "int32"

    def __post_init__(self) -> None:
        _check_name(self.name)
        if self.dtype not in SCALAR_DTYPES:
            raise ValueError(f"unknown scalar dtype {self.dtype!r}; choose one of: {', '.join(SCALAR_DTYPES)}")


@dataclass(frozen=True)
class Launch:
    """How to call a kernel: entry symbol, ordered arguments, and (cuda) grid, block, dynamic shared bytes; or,
    with ``library`` set, which library routine the worker calls on the arguments (see ``transforms.worker``)."""

    entry: str
    args: tuple[Buffer | Scalar, ...]
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    shared_bytes: int = 0
    library: str = ""

    def __post_init__(self) -> None:
        _check_name(self.entry)
        names = [a.name for a in self.args]
        if len(set(names)) != len(names):
            raise ValueError(f"launch of {self.entry!r} repeats an argument name: {', '.join(names)}")

    @property
    def buffers(self) -> list[Buffer]:
        return [a for a in self.args if isinstance(a, Buffer)]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["args"] = [{"type": type(a).__name__, **asdict(a)} for a in self.args]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Launch":
        types = {"Buffer": Buffer, "Scalar": Scalar}
        args = tuple(types[a.pop("type")](**a) for a in (dict(a) for a in data["args"]))
        return cls(data["entry"], args, tuple(data["grid"]), tuple(data["block"]), data["shared_bytes"],
                   data.get("library", ""))


class Problem:
    """Inputs (by buffer name), references (by output name; float64, or float32 for low-precision outputs) and
    per-output tolerance overrides, shared by the trials of one subgraph.

    ``Problem(inputs, reference, tolerance)`` holds host arrays. ``Problem.described(spec, tolerance, build)`` is
    also described by ``spec``, a JSON document from which the worker builds the arrays itself
    (``transforms.problem``): a cuda trial sends the spec, and the worker builds the problem on its GPU. Its host
    arrays are built, by ``build()``, only when something reads ``inputs`` or ``reference`` (a cpu trial, a check
    on the host).
    """

    def __init__(self, inputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
                 tolerance: Mapping[str, float] | None = None, tf32: Mapping[str, float] | None = None) -> None:
        self.tolerance: Mapping[str, float] = {} if tolerance is None else tolerance
        self.tf32: Mapping[str, float] = {} if tf32 is None else tf32  # raised tolerances of trials in TF32
        self.spec: dict[str, Any] | None = None
        self._arrays: tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]] | None = (inputs, reference)
        self._build: Callable[[], Problem] | None = None

    @classmethod
    def described(cls, spec: dict[str, Any], tolerance: Mapping[str, float], build: Callable[[], "Problem"]) \
            -> "Problem":
        """A problem the worker builds from ``spec``; ``build()`` makes its host arrays when they are read."""
        problem = cls({}, {}, tolerance)
        problem.spec, problem._arrays, problem._build = spec, None, build
        return problem

    @property
    def inputs(self) -> Mapping[str, np.ndarray]:
        return self._host()[0]

    @property
    def reference(self) -> Mapping[str, np.ndarray]:
        return self._host()[1]

    def _host(self) -> tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]:
        if self._arrays is None:
            assert self._build is not None
            built = self._build()
            self._arrays = (built.inputs, built.reference)
            # building may raise a tolerance (transforms.problem: what a plain float32 evaluation errs)
            self.tolerance, self.tf32 = _merged(self.tolerance, built.tolerance), _merged(self.tf32, built.tf32)
        return self._arrays

    def tolerances(self, launches: Sequence[Launch]) -> dict[str, float]:
        """Tolerance per output buffer of ``launches``: the override, else :data:`TOLERANCE` (ints: 0). Launches
        that compute in TF32 (a ``tf32`` scalar of 1) hold float32 outputs to float16's tolerance instead, widened
        alike (TF32 keeps float16's 10-bit mantissa), or to what a TF32 evaluation errs (``tf32``) when more."""
        tf32 = computes_in_tf32(launches)
        out = {}
        for b in buffers_of(launches):
            if b.kind == "output":
                out[b.name] = self.tolerance.get(b.name, TOLERANCE.get(b.dtype, 0.0))
                if tf32 and b.dtype == "float32":
                    out[b.name] = max(out[b.name] * TOLERANCE["float16"] / TOLERANCE["float32"],
                                      self.tf32.get(b.name, 0.0))
        return out

    def save(self, path: Path) -> None:
        arrays = {f"in.{k}": np.asarray(v) for k, v in self.inputs.items()}
        arrays |= {f"ref.{k}": _float_reference(v) for k, v in self.reference.items()}
        np.savez(path, **arrays)


def _float_reference(values: Any) -> np.ndarray:
    """A reference as float32 when given so, else float64."""
    values = np.asarray(values)
    return values if values.dtype == np.float32 else values.astype(np.float64, copy=False)


def _merged(known: Mapping[str, float], built: Mapping[str, float]) -> dict[str, float]:
    return {**known, **{k: max(v, known.get(k, 0.0)) for k, v in built.items()}}


def computes_in_tf32(launches: Sequence[Launch]) -> bool:
    """Whether a launch rounds float32 operands to TF32 (a library launch's ``tf32`` scalar is 1)."""
    return any(isinstance(a, Scalar) and a.name == "tf32" and a.value == 1 for launch in launches for a in launch.args)


def buffers_of(launches: Sequence[Launch]) -> list[Buffer]:
    """The distinct buffers of a launch sequence, first use first; a name used with two shapes is an error."""
    seen: dict[str, Buffer] = {}
    for launch in launches:
        for b in launch.buffers:
            if seen.setdefault(b.name, b) != b:
                raise ValueError(f"buffer {b.name!r} is described differently by two launches")
    return list(seen.values())


@dataclass(frozen=True)
class Trial:
    """One candidate to run: what was built, the launches that run it (in order; one Launch is accepted), on
    which problem."""

    build: BuildResult
    launches: tuple[Launch, ...]
    problem: Problem

    def __post_init__(self) -> None:
        launches = (self.launches,) if isinstance(self.launches, Launch) else tuple(self.launches)
        if not launches:
            raise ValueError("a trial needs at least one launch")
        object.__setattr__(self, "launches", launches)


class JsonLines:
    """The JSON lines a file descriptor carries, read as they come (``select``): the worker's replies, its messages."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buffer, self.closed = fd, b"", False

    def next(self, timeout_s: float | None) -> dict[str, Any] | None:
        """The next message, waiting at most ``timeout_s`` (None: as long as it takes; 0: not at all); None when none
        has come by then or the input is closed (``closed``)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self.buffer:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if self.closed or not select.select([self.fd], [], [], remaining)[0]:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                self.closed = True
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)


class Worker:
    """A ``python -m transforms.worker`` subprocess that runs one trial at a time.

    A trial that outlives its timeout kills the worker (result kind "timeout"); a worker that dies (a
    segfault, an abort) gives kind "launch". Either way the next trial starts a fresh worker. The problems of
    the last :data:`KEPT_PROBLEMS` subgraphs stay saved (``problem_file``), so the batches of one search save
    and the worker loads (and uploads) each problem once; a cuda trial of a problem with a spec sends the spec
    (``problem_source``), and the worker builds the problem on its GPU once for consecutive trials.
    """

    def __init__(self, *, python: str = sys.executable, startup_timeout_s: float = 60.0) -> None:
        self.python = python
        self.startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._lines: JsonLines | None = None  # the worker's replies
        self._folder: tempfile.TemporaryDirectory[str] | None = None
        self._saved: dict[int, tuple[weakref.ref[Problem], Path]] = {}
        self._ready = False
        self._owed = 0  # acknowledgements of prepare and load messages not read yet
        self._loads: set[str] = set()  # what the process was told to load
        self.starts = self.saves = self.ahead = 0

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def problem_file(self, problem: Problem) -> str:
        """The path of ``problem`` saved for the worker: saved on first use, kept while it is among the last
        :data:`KEPT_PROBLEMS` problems asked for."""
        known = self._saved.pop(id(problem), None)
        if known is not None and known[0]() is not problem:  # a new problem where a dropped one lived
            known[1].unlink(missing_ok=True)
            known = None
        if known is None:
            if self._folder is None:
                self._folder = tempfile.TemporaryDirectory(prefix="tunebank-problems-")
            path = Path(self._folder.name) / f"problem{self.saves}.npz"
            problem.save(path)
            self.saves += 1
            known = (weakref.ref(problem), path)
        self._saved[id(problem)] = known  # most recent last
        while len(self._saved) > KEPT_PROBLEMS:
            self._saved.pop(next(iter(self._saved)))[1].unlink(missing_ok=True)
        return str(known[1])

    def spec_source(self, problem: Problem, backend: str) -> dict[str, Any] | None:
        """``{"spec": ...}`` when a ``backend`` trial sends ``problem`` as its spec (cuda, a problem with a spec: the
        worker builds it on the GPU), else None."""
        return {"spec": problem.spec} if backend == "cuda" and problem.spec is not None else None

    def problem_source(self, problem: Problem, backend: str) -> str | dict[str, Any]:
        """What a ``backend`` trial tells the worker to load ``problem`` from: its spec (:meth:`spec_source`), else
        the path of the saved problem."""
        return self.spec_source(problem, backend) or self.problem_file(problem)

    def prepare(self, problems: Sequence[Problem], backend: str, *, warm: Sequence[str] = ()) -> None:
        """Tell the worker which problems ``backend`` trials ask for next, in order: it builds those sent as specs
        while it waits for trials (``transforms.worker.Problems``), so building them overlaps the caller's own work
        (candidates generated and compiled); then it warms the libraries named in ``warm``
        (``transforms.worker.WARM``). Not waited for; a worker that cannot start is left to the next trial."""
        sources = [s for p in problems if (s := self.spec_source(p, backend)) is not None]
        if sources or warm:
            self._send({"prepare": sources, "backend": backend, "warm": list(warm)})

    def settle(self) -> int:
        """Drop the problems prepared and wait until the worker has stopped building them (a caller about to time on
        the GPU itself wants no work of the worker's beside it); how many trials found their problem built ahead."""
        if self._proc is not None and self._send({"prepare": [], "backend": "cpu"}):
            try:
                self._acknowledged(CLOSE_TIMEOUT_S + self.startup_timeout_s)
            except (TimeoutError, EOFError):
                self._proc.kill()
                self._stop()
        return self.ahead

    def _send(self, message: dict[str, Any], *, started: bool = False) -> bool:
        """Send a ``prepare`` or ``load`` message, whose acknowledgement is read before the next reply; whether it
        went. ``started``: to the process there is, without waiting for it to be ready."""
        try:
            if not started:
                self._start()
            assert self._proc is not None and self._proc.stdin is not None
            self._proc.stdin.write(json.dumps(message).encode() + b"\n")
            self._proc.stdin.flush()
        except (TimeoutError, EOFError, BrokenPipeError):
            if self._proc is not None:
                self._proc.kill()
            self._stop()
            return False
        self._owed += 1
        return True

    def _acknowledged(self, timeout_s: float) -> None:
        """Read the acknowledgements of the ``prepare`` and ``load`` messages sent."""
        while self._owed:
            self.ahead = int(self._read(timeout_s)["ahead"])
            self._owed -= 1

    def close(self) -> None:
        """Stop the worker process (if any) and delete the saved problems. A worker between trials is not waited for:
        it exits at the end of its input (its CUDA teardown takes most of a second) or is killed after
        :data:`CLOSE_TIMEOUT_S`, on a thread of its own."""
        self._stop(wait=False)
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None
        self._saved.clear()

    def _stop(self, *, wait: bool = True) -> None:
        if self._proc is not None:
            if not self._ready:  # warmed and never used: nothing to finish
                self._proc.kill()
            elif self._proc.poll() is None and self._proc.stdin is not None:
                self._proc.stdin.close()  # a worker between trials exits at the end of its input
            if wait or not self._ready:
                _reap(self._proc)
            else:
                threading.Thread(target=_reap, args=(self._proc,), daemon=True).start()
            self._proc = None
        self._owed = 0
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        self._lines = None

    def warm(self, load: Sequence[str] = ()) -> None:
        """Start the worker process now without waiting for it: its imports, and what ``load`` names
        (``transforms.worker.LOADS``), overlap the caller's own work until the first trial, which waits for it to be
        ready. A worker already started is told to load what it was not told before (a ``load`` message)."""
        if self._proc is None:
            self._spawn(load)
        more = [name for name in load if name not in self._loads]
        if more and self._send({"load": more}, started=True):
            self._loads.update(more)

    def _spawn(self, load: Sequence[str] = ()) -> None:
        """A worker process: for a cuda worker (told to load ``cuda``) the spare one if there is one (:class:`_Spare`),
        else a new one told to load ``load`` as it starts, and a new spare for the next cuda worker. (A cpu worker
        times by the wall clock: it wants no process whose imports may still run beside its trials.)"""
        cuda = "cuda" in load
        spare = _spare.take(self.python) if cuda else None
        self._proc, self._stderr, self._lines, loaded = spare or _launch(self.python, load)
        if cuda:
            _spare.start(self.python)
        self.starts += 1
        self._ready = False
        self._loads = set(loaded)

    def _start(self) -> None:
        """A worker ready for a trial: spawned if there is none, its ready line read if not yet."""
        if self._proc is None:
            self._spawn()
        if not self._ready:
            self._read(self.startup_timeout_s)
            self._ready = True

    def _read(self, timeout_s: float) -> dict[str, Any]:
        """The next JSON line; TimeoutError or EOFError when none comes."""
        assert self._lines is not None
        message = self._lines.next(timeout_s)
        if message is None:
            raise EOFError if self._lines.closed else TimeoutError
        return message

    def _death(self) -> str:
        assert self._proc is not None and self._stderr is not None
        code = self._proc.wait()
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        self._stderr.seek(0)
        tail = self._stderr.read().decode(errors="replace").strip()[-1000:]
        return f"worker died with {how}" + (f": {tail}" if tail else "")

    def request(self, message: dict[str, Any], timeout_s: float) -> RunResult:
        """Send one trial message and return its result; failures of any kind come back as values."""
        try:
            self._start()
            assert self._proc is not None and self._proc.stdin is not None
            self._proc.stdin.write(json.dumps(message).encode() + b"\n")
            self._proc.stdin.flush()
            self._acknowledged(timeout_s)
            reply = self._read(timeout_s)
        except TimeoutError:
            assert self._proc is not None
            self._proc.kill()
            self._stop()
            return RunResult.failure("timeout", f"no result within {timeout_s:g} s; the worker was killed")
        except (EOFError, BrokenPipeError):
            error = self._death()
            self._stop()
            return RunResult.failure("launch", error)
        if reply.pop("fatal"):
            self._stop()
        return RunResult.from_json(reply)


def worker_environment() -> dict[str, str]:
    """The worker process's environment: this one's, with CuPy set to compile its own kernels (the reference
    evaluator's, compiled at first use and cached on disk for the machine) faster. Reductions run without CUB
    (``CUPY_ACCELERATORS`` empty), whose headers made one NVRTC compile of a reduction take 2.7 s, and NVRTC's compiles
    share precompiled headers (``CUPY_NVRTC_USE_PCH``; CuPy passes ``--pch`` only to an NVRTC that has them, 12.8 on):
    on an H200 a fresh machine built tabular_mlp's 8 problems in 3.2 s with both, against 11.4 s
    (``bench/README.md``)."""
    return dict(os.environ, CUPY_ACCELERATORS="", CUPY_NVRTC_USE_PCH="1")


Launched = tuple[subprocess.Popen[bytes], IO[bytes], JsonLines, tuple[str, ...]]  # process, stderr, replies, loads


def _launch(python: str, load: Sequence[str], env: Mapping[str, str] | None = None) -> Launched:
    """A ``python -m transforms.worker`` process told to load ``load`` as it starts, in ``env`` (by default
    :func:`worker_environment`)."""
    stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the worker; closed when it stops)
    process = subprocess.Popen([python, "-m", "transforms.worker", *load], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=stderr, cwd=_ROOT, env=env or worker_environment())
    assert process.stdout is not None
    return process, stderr, JsonLines(process.stdout.fileno()), tuple(load)


class _Spare:
    """One worker process started when a cuda :class:`Worker` starts its own, which loads :data:`SPARE_LOADS` and waits
    for the next Worker of this process to adopt it: its imports (CuPy, the problem builder and torch: 0.5-2.5 s on an
    H200 machine, on a thread that slowed the first trials and held up the first cuDNN trial) are paid beside the
    optimize before, not inside the next one. (Started when that optimize ended, as it was first, it was still
    importing torch when the next optimize began, so the problems built first there took their references from
    CuPy's evaluator, whose kernels compile at first use: ``transforms.problem``.) It makes no CUDA context (the
    adopting Worker tells it to), so nothing of it is on the GPU while the caller times its model (a worker kept idle
    between optimizes with its context slowed models timed beside it, cause not isolated: ``docs/design.md``). A
    Worker adopts it only where it would start the same process: the same python, the same environment (a
    ``CUDA_VISIBLE_DEVICES`` changed since names another GPU). Killed when the process exits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: tuple[tuple[str, dict[str, str]], Launched] | None = None  # ((its python, its environment), it)
        self._exit_hook = False

    def start(self, python: str) -> None:
        """Start the spare unless one is waiting."""
        with self._lock:
            if self._held is not None and self._held[1][0].poll() is None:
                return
            self._drop()  # it died
            env = worker_environment()
            self._held = ((python, env), _launch(python, SPARE_LOADS, env))
            if not self._exit_hook:
                atexit.register(self.discard)
                self._exit_hook = True

    def take(self, python: str) -> Launched | None:
        """The spare, when one running ``python`` in this process's environment is alive; it is no longer the
        spare. One that died, or was started for another python or environment, is dropped."""
        with self._lock:
            if self._held is not None and (self._held[1][0].poll() is not None
                                           or self._held[0] != (python, worker_environment())):
                self._drop()
            if self._held is None:
                return None
            held, self._held = self._held[1], None
            return held

    def discard(self) -> None:
        """Kill the spare, if any."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._held is not None:
            process, stderr = self._held[1][:2]
            process.kill()
            _reap(process)
            stderr.close()
            self._held = None


_spare = _Spare()


def _reap(process: subprocess.Popen[bytes]) -> None:
    """Wait for a worker told to exit, killing it after :data:`CLOSE_TIMEOUT_S`, and close its pipes."""
    try:
        process.wait(timeout=CLOSE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):  # a write the dead process never read
                pipe.close()


def finish(steps: Generator[None, None, T]) -> T:
    """Run a computation made a step at a time (a generator that yields between steps) to its end: its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def fastest(results: Sequence[RunResult], known_s: float = math.inf) -> float:
    """The fastest median among ``results`` timed in full (not by one call) and ``known_s``."""
    return min([known_s, *(r.median_s for r in results if r.ok and r.repeats > 1)])


def run(
    trials: Iterable[Trial],
    *,
    timeout_s: float = 30.0,
    warmup: int = 3,
    repeats: int = 30,
    worker: Worker | None = None,
    best_s: float = math.inf,
) -> list[RunResult]:
    """Validate and time ``trials`` one at a time, each bounded by ``timeout_s``; one RunResult per trial (an
    iterator of trials is drawn one trial at a time, e.g. as their builds finish).

    A trial whose build failed gets its build's error kind without running. Pass a ``worker`` to reuse
    one across calls; otherwise one is started and stopped here. ``best_s``: the fastest time known before these
    trials (the incumbent); a trial far slower than it or than the batch's fastest so far is timed by one call
    (:data:`SLOWER_FACTOR`; its result has ``repeats == 1``).
    """
    own = worker is None
    worker = worker or Worker()
    results: list[RunResult] = []
    best = best_s
    try:
        for trial in trials:
            if not trial.build.ok:
                results.append(RunResult.failure(trial.build.error_kind or "compile", trial.build.error))
                continue
            # the problem's source first: building its host arrays (a cpu trial) may raise its tolerances
            source = worker.problem_source(trial.problem, trial.build.backend)
            message = {
                "backend": trial.build.backend,
                "artifact": trial.build.artifact,
                "launches": [launch.to_json() for launch in trial.launches],
                "problem": source,
                "tolerance": trial.problem.tolerances(trial.launches),
                "warmup": warmup,
                "repeats": repeats,
                "slower_than_s": max(SLOWER_FACTOR * best, SLOWER_FLOOR_S) if math.isfinite(best) else None,
            }
            results.append(worker.request(message, timeout_s))
            best = fastest(results[-1:], best)
    finally:
        if own:
            worker.close()
    return results
