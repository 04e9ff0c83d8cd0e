"""The worker process: ``python -m transforms.worker`` reads trial messages (JSON lines) on stdin and writes
one result per line. Started and restarted by :class:`transforms.run.Worker`; see :mod:`transforms.run`
for the contract (validation, and timing by CUDA-graph replay over buffer copies that exceed the L2 cache).
Imports only the standard library, NumPy, ctypes and (for cuda trials) CuPy; a problem sent as a spec is built with
``transforms.problem``, which also needs ``embed`` (pydantic). What the worker is
started with (:data:`LOADS`, as arguments) it imports on a thread while it builds problems ahead and runs trials; a
trial of a library routine run through PyTorch waits for those imports. On cuda every timing is taken behind a gate
(``transforms.gate``), so the imports' thread holding the interpreter delays a timing but is not timed.
"""

import contextlib
import ctypes
import importlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from transforms import device_check, vendor_blas, vendor_torch
from transforms.compilers import cpu, cuda
from transforms.gate import gate
from transforms.results import RunResult
from transforms.run import (
    Buffer,
    JsonLines,
    Launch,
    Scalar,
    buffers_of,
    computes_in_tf32,
    finish,
    poison,
    poisoned,
    to_float,
    to_storage,
)

Call = Callable[[], None]
Fetch = Callable[[], dict[str, Any]]  # the buffers, in the backend's memory
_CTYPES = {"float64": ctypes.c_double, "float32": ctypes.c_float, "int64": ctypes.c_int64, "int32": ctypes.c_int32}
#: cuda timing: buffer copies together exceed this many L2 caches; at most this many copies and bytes.
L2_MULTIPLE = 2
MAX_COPIES = 64
MAX_COPY_BYTES = 8 << 30
DEFAULT_SHARED_LIMIT = 48 * 1024
#: Timing stops after this many seconds of timed calls once MIN_REPEATS are in: a candidate far slower than the
#: rest (a bad random recipe) costs about a second, not ``repeats`` times its own run time.
TIMING_BUDGET_S = 1.0
MIN_REPEATS = 3
#: A call at least this long is timed without warm-up (the call that measured it warmed it) and, on cuda, without
#: buffer copies: whatever the L2 cache holds when it starts is worth at most L2 size / bandwidth (~15 us on an
#: H200), under 1.5% of it, while copies multiply its cost (a 9 ms random recipe with 33 copies took 287 ms a replay).
LONG_CALL_S = 0.001
#: How much longer than later calls a generated cuda kernel's first call may take (instruction and TLB caches cold):
#: up to 0.5 ms for kernels under 1 ms, and 0.97 ms over 278 kernels of conv and GEMM subgraphs on an H200
#: (``bench/README.md``); a first call this much over ``slower_than_s`` is past it in any later call.
FIRST_CALL_ALLOWANCE_S = 0.002


def host_arrays(launches: Sequence[Launch], inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Fresh storage arrays for every buffer of ``launches``: inputs converted (copied, so a kernel that writes
    one spoils nothing shared), outputs and scratch poisoned (a kernel must write scratch before it reads it: a
    plan hands it uninitialized memory)."""
    arrays = {}
    for b in buffers_of(launches):
        if b.kind == "input":
            arrays[b.name] = np.array(to_storage(problem_input(inputs, b), b.dtype), copy=True)
        else:
            arrays[b.name] = poisoned(b.shape, b.dtype)
    return arrays


def problem_input(inputs: Mapping[str, np.ndarray], b: Buffer) -> np.ndarray:
    """The problem's array for input buffer ``b``; ValueError when it is missing or mis-shaped."""
    if b.name not in inputs:
        raise ValueError(f"the problem has no input for buffer {b.name!r}")
    if inputs[b.name].shape != b.shape:
        raise ValueError(f"input {b.name!r} has shape {inputs[b.name].shape}, the launch wants {b.shape}")
    return inputs[b.name]


class LoadedProblem:
    """A problem's inputs and references (host arrays from a saved file, or arrays the worker built from a spec),
    with what backends derive from them (device copies) kept across the trials of that problem."""

    def __init__(self, source: str | dict[str, Any], inputs: Mapping[str, Any], reference: Mapping[str, Any],
                 tolerance: Mapping[str, float] | None = None, tf32: Mapping[str, float] | None = None,
                 raise_tolerances: Callable[[], tuple[dict[str, float], dict[str, float]]] | None = None) -> None:
        self.source = source
        self.inputs, self.reference = dict(inputs), dict(reference)
        # what building it found (a spec's tolerances, for trials in float32 and in TF32), beside the trial's own
        self.tolerance, self.tf32 = dict(tolerance or {}), dict(tf32 or {})
        self._raise = raise_tolerances
        self.derived: dict[tuple[str, ...], Any] = {}

    def raise_tolerances(self) -> bool:
        """Compute the tolerances a spec's problem raises only when asked (``transforms.problem.make_problem_lazily``:
        another evaluation of the program), merging them in; whether any tolerance rose (False once computed)."""
        if self._raise is None:
            return False
        tolerance, tf32 = self._raise()
        self._raise = None
        rose = False
        for known, raised in ((self.tolerance, tolerance), (self.tf32, tf32)):
            for name, value in raised.items():
                rose |= value > known.get(name, 0.0)
                known[name] = max(known.get(name, 0.0), value)
        return rose

    @classmethod
    def open(cls, source: str | dict[str, Any], xp: Any = np) -> "LoadedProblem":
        """The problem a trial message names: the path of a saved problem, or ``{"spec": ...}``, built with ``xp``
        (the backend's array module: CuPy builds it on the GPU)."""
        return finish(cls.open_steps(source, xp))

    @classmethod
    def open_steps(cls, source: str | dict[str, Any], xp: Any = np) -> Generator[None, None, "LoadedProblem"]:
        """:meth:`open` a step at a time: a spec's problem yields after its inputs are drawn and after each nest of
        its reference (``transforms.problem.problem_steps``), so a worker building it ahead answers a message
        meanwhile; its references are PyTorch's when this worker has loaded torch (:data:`LOADED`) by then."""
        if isinstance(source, str):
            with np.load(source, allow_pickle=False) as data:
                arrays = dict(data)
            return cls(source, {k[3:]: v for k, v in arrays.items() if k.startswith("in.")},
                       {k[4:]: v for k, v in arrays.items() if k.startswith("ref.")})
        from transforms.problem import problem_from_spec_steps  # embed and pydantic: only for problems sent as specs

        with_torch = "torch" in LOADED
        built, raise_tolerances = yield from problem_from_spec_steps(source["spec"], xp, torch_reference=with_torch)
        return cls(source, built.inputs, built.reference, built.tolerance, built.tf32, raise_tolerances)

    def cached(self, key: tuple[str, ...], make: Callable[[], Any]) -> Any:
        """``make()``, computed once per key for this problem."""
        if key not in self.derived:
            self.derived[key] = make()
        return self.derived[key]


def copies_past_l2(set_bytes: int, l2_bytes: int) -> int:
    """How many copies of a buffer set of ``set_bytes`` together exceed ``L2_MULTIPLE`` L2 caches (at least 2)."""
    wanted = -(-L2_MULTIPLE * l2_bytes // max(set_bytes, 1)) + 1
    return max(2, min(wanted, MAX_COPIES, max(1, MAX_COPY_BYTES // max(set_bytes, 1))))


#: The error of an element is measured against ``max(|reference|, floor)``, and the floor is the larger of
#: FLOOR_FRACTION times the largest finite ``|reference|`` of that output (elements near zero, where rounding
#: leaves an absolute error on the scale of the whole output, are not held to a relative bound they cannot meet)
#: and the smallest normal number of the output's dtype (below it the dtype itself keeps only absolute precision).
#: The floor scales with the reference: a softmax whose values are all about 1e-3 is held to 1e-4 of 1e-3.
FLOOR_FRACTION = 1e-3
_NORMAL = {"float64": np.float64, "float32": np.float32, "float16": np.float16, "bfloat16": np.float32}


def check(output: Any, reference: Any, tolerance: float, xp: Any = np, *, dtype: str | None = None) \
        -> tuple[str | None, float | None, str]:
    """(error kind or None, max relative error over finite elements, message) for one output, computed in the
    reference's float dtype; ``xp`` is the array module both arrays live in (NumPy, or CuPy for a device output,
    which is then checked on the device by ``transforms.device_check``); ``dtype`` is the output buffer's dtype
    (default: the reference's).

    The error of element i is ``|out_i - ref_i| / max(|ref_i|, floor)`` (floor: :data:`FLOOR_FRACTION`); the
    output is "wrong" when the largest exceeds ``tolerance``. Non-finite values are compared exactly: an
    infinity must match the reference's (same sign), a NaN never passes; a non-finite output where the
    reference differs is "nan", a finite output where the reference is not is "wrong"."""
    if not tolerance >= 0:  # a NaN tolerance would pass everything
        raise ValueError(f"the tolerance must be a number >= 0, not {tolerance!r}")
    if output.shape != reference.shape:
        return "wrong", None, f"output shape {output.shape} != reference shape {reference.shape}"
    if reference.dtype.kind != "f":  # an integer output's reference, as a problem built on the GPU holds it
        reference = reference.astype(np.float64)
    normal = float(np.finfo(_NORMAL.get(dtype or "", reference.dtype)).tiny)
    sums = tally if xp is np else device_check.tally
    worst, mismatched, bad_output = sums(output, reference, FLOOR_FRACTION, normal)
    if bad_output:
        return "nan", worst, f"{bad_output} of {output.size} elements are NaN or infinite"
    if mismatched or worst > tolerance:
        return "wrong", worst, f"max relative error {worst:.3g} exceeds the tolerance {tolerance:g}"
    return None, worst, ""


def tally(output: np.ndarray, reference: np.ndarray, floor_fraction: float, normal: float) -> tuple[float, int, int]:
    """What :func:`check` decides on: (the largest error over elements where both are finite, against
    ``max(|ref_i|, floor)`` with floor the larger of ``floor_fraction`` times the largest such ``|ref_i|`` and
    ``normal``; elements where either is not finite and they differ; those of them where the output is not finite)."""
    with np.errstate(all="ignore"):
        finite = np.isfinite(output) & np.isfinite(reference)
        nonfinite_mismatch = ~finite & (output != reference)  # NaN != NaN
        magnitude = np.where(finite, np.abs(reference), 0)
        floor = max(floor_fraction * _largest(magnitude), normal)
        gap = np.abs(output - reference) / np.maximum(magnitude, reference.dtype.type(floor))
        worst = _largest(np.where(finite, gap, 0))
    bad_output = nonfinite_mismatch & ~np.isfinite(output)
    return worst, int(np.count_nonzero(nonfinite_mismatch)), int(np.count_nonzero(bad_output))


def _largest(values: np.ndarray) -> float:
    return float(values.max()) if values.size else 0.0


def wall_seconds(call: Call) -> float:
    """Seconds of one call by the wall clock."""
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


#: Library routines run through PyTorch (``transforms.vendor_torch``): a trial of one waits for the worker's imports,
#: and none is timed behind the gate outside a CUDA graph (PyTorch may synchronize inside a call: cuDNN's search, its
#: allocator).
TORCH_LIBRARIES = frozenset({"cudnn_conv", "torch_conv", "torch_matmul"})


def needs_torch(libraries: Iterable[str | None]) -> bool:
    """Whether any of the launches' ``library`` names a routine run through PyTorch (:data:`TORCH_LIBRARIES`)."""
    return not TORCH_LIBRARIES.isdisjoint(libraries)


def within_budget(repeats: int) -> Iterator[int]:
    """Indices of timed calls: ``repeats`` of them, fewer (at least :data:`MIN_REPEATS`) once
    :data:`TIMING_BUDGET_S` of wall time has passed since the first."""
    deadline = time.perf_counter() + TIMING_BUDGET_S
    for k in range(repeats):
        if k >= MIN_REPEATS and time.perf_counter() > deadline:
            return
        yield k


class CpuBackend:
    """Calls each launch's ``entry(...)`` of a shared library through ctypes; times with perf_counter_ns."""

    xp = np
    #: Whether a generated kernel's first call takes as long as later ones: not on cpu, where a process's first
    #: OpenMP parallel region starts the thread pool.
    first_call_is_steady = False

    def usable(self) -> bool:
        """Whether the worker can go on after a trial failed: a cpu kernel that could break the process kills it."""
        return True

    def arrays(self, launches: Sequence[Launch], problem: LoadedProblem) -> dict[str, np.ndarray]:
        return host_arrays(launches, problem.inputs)

    def reference(self, problem: LoadedProblem, name: str) -> np.ndarray:
        return problem.reference[name]

    def bind(self, artifact: str, launches: Sequence[Launch], arrays: dict[str, np.ndarray]) -> tuple[Call, Fetch]:
        calls = []
        for function, launch in zip(cpu_functions(artifact, launches), launches, strict=True):
            args = [ctypes.c_void_p(arrays[a.name].ctypes.data) if isinstance(a, Buffer) else c_scalar(a)
                    for a in launch.args]
            calls.append((function, args))

        def call() -> None:
            for function, args in calls:
                function(*args)

        return call, lambda: arrays

    def call_seconds(self, call: Call, gated: bool) -> float:
        """Wall-clock seconds of one call."""
        return wall_seconds(call)

    def time(self, call: Call, warmup: int, repeats: int, call_s: float) -> list[float]:
        for _ in range(0 if call_s >= LONG_CALL_S else warmup):
            call()
        times: list[float] = []
        for _ in within_budget(repeats):
            start = time.perf_counter_ns()
            call()
            times.append((time.perf_counter_ns() - start) * 1e-9)
        return times


class CudaBackend:
    """Launches the kernels of a PTX module with CuPy; times by CUDA-graph replay over rotated buffer copies."""

    #: A module's kernels are loaded when bound (``cuModuleGetFunction``, also under lazy loading), before any call.
    first_call_is_steady = True

    def __init__(self) -> None:
        import cupy

        self.cupy = self.xp = cupy

    def usable(self) -> bool:
        """Whether the CUDA context still works after a trial failed. A sticky error (an illegal address, a trap)
        leaves it unusable, so the worker must restart; an invalid launch configuration or a vendor routine that
        refuses its arguments does not, and the next trial can run in this process (a restart costs seconds of
        imports and problem building)."""
        cp = self.cupy
        try:
            cp.cuda.Device().synchronize()
            return int((cp.arange(4, dtype=cp.int32) + 1).sum()) == 10
        except Exception:
            return False

    def arrays(self, launches: Sequence[Launch], problem: LoadedProblem) -> dict[str, Any]:
        """Device arrays for every buffer: each input a copy of the problem's device copy (uploaded once per
        problem, or built there), outputs and scratch poisoned on the device (see :func:`host_arrays`)."""
        cp, out = self.cupy, {}
        for b in buffers_of(launches):
            if b.kind == "input":
                def upload(b: Buffer = b) -> Any:
                    return to_storage(problem_input(problem.inputs, b), b.dtype, cp)

                out[b.name] = problem.cached(("cuda", b.name, b.dtype), upload).copy()
            else:
                storage, value = poison(b.dtype)
                out[b.name] = cp.full(b.shape, value, storage)
        return out

    def reference(self, problem: LoadedProblem, name: str) -> Any:
        return problem.cached(("cuda", "reference", name), lambda: self.cupy.asarray(problem.reference[name]))

    def bind(self, artifact: str, launches: Sequence[Launch], arrays: dict[str, np.ndarray]) -> tuple[Call, Fetch]:
        cp = self.cupy
        functions = cuda_functions(artifact, launches)
        first = {name: cp.asarray(array) for name, array in arrays.items()}
        cp.cuda.Device().synchronize()  # the uploads ran on the default stream; the kernels run on another
        self.set_bytes = sum(a.nbytes for a in arrays.values())
        self.stream = cp.cuda.Stream(non_blocking=True)

        def launch_all(device: dict[str, Any]) -> None:
            for function, launch in zip(functions, launches, strict=True):
                args = tuple(device[a.name] if isinstance(a, Buffer) else np.dtype(a.dtype).type(a.value)
                             for a in launch.args)
                function(launch.grid, launch.block, args, shared_mem=launch.shared_bytes, stream=self.stream)

        def call() -> None:
            launch_all(first)
            self.stream.synchronize()

        self.launch_first = lambda: launch_all(first)

        def capture(copies: int) -> Any:
            sets = [first] + [{n: a.copy() for n, a in first.items()} for _ in range(copies - 1)]
            cp.cuda.Device().synchronize()  # the copies ran on the default stream; the kernels run on another
            with self.stream:
                self.stream.begin_capture()
                for device in sets:
                    launch_all(device)
                return self.stream.end_capture()

        self.capture = capture
        return call, lambda: first

    def call_seconds(self, call: Call, gated: bool) -> float:
        """Seconds of one call: by CUDA events behind the gate (``transforms.gate``: the host's own delays left out),
        or where a launch may load a kernel or synchronize on the host inside its call (``gated`` False), by the
        wall clock."""
        if not gated:
            return wall_seconds(call)
        cp = self.cupy
        start, end = cp.cuda.Event(), cp.cuda.Event()
        with gate(self.stream):
            start.record(self.stream)
            self.launch_first()
            end.record(self.stream)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) * 1e-3

    def time(self, call: Call, warmup: int, repeats: int, call_s: float) -> list[float]:
        """Seconds per launch sequence: each replay of the graph of all copies, over the number of copies.
        A call that took ``call_s >= LONG_CALL_S`` is replayed alone, with no warm-up."""
        cp = self.cupy
        long_call = call_s >= LONG_CALL_S
        l2 = int(cp.cuda.Device().attributes["L2CacheSize"])
        copies = 1 if long_call else copies_past_l2(self.set_bytes, l2)
        graph = self.capture(copies)
        for _ in range(0 if long_call else max(warmup, 1)):
            graph.launch(self.stream)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        times: list[float] = []
        for _ in within_budget(repeats):
            with gate(self.stream):  # the replay's kernels are loaded: the calls before it loaded them
                start.record(self.stream)
                graph.launch(self.stream)
                end.record(self.stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) * 1e-3 / copies)
        return times


_LIBRARY: dict[str, Callable[[Launch], Callable[..., None]]] = {"cublas_gemm": vendor_blas.cublas_gemm,
                                                               "cublaslt_matmul": vendor_blas.cublaslt_matmul,
                                                               "cudnn_conv": vendor_torch.cudnn_conv,
                                                               "torch_conv": vendor_torch.torch_conv}
#: cpu library launches: called like a cpu kernel, with the buffers' data pointers (``transforms.vendor_torch``).
_CPU_LIBRARY: dict[str, Callable[[Launch], Callable[..., None]]] = {
    "torch_conv": lambda launch: vendor_torch.torch_conv(launch, "cpu"),
    "torch_matmul": lambda launch: vendor_torch.torch_matmul(launch, "cpu"),
}


def c_scalar(arg: Scalar) -> Any:
    """A scalar argument as the ctypes value a cpu kernel takes."""
    return _CTYPES[arg.dtype](arg.value)


def cpu_functions(artifact: str, launches: Sequence[Launch]) -> list[Any]:
    """Each launch's entry in the shared library at ``artifact`` (ctypes functions returning nothing), or the vendor
    routine a library launch names (called the same way: data pointers, then scalars)."""
    library = cpu.load(artifact)
    functions = []
    for launch in launches:
        if launch.library:
            if launch.library not in _CPU_LIBRARY:
                raise ValueError(f"unknown cpu library routine {launch.library!r}")
            functions.append(_CPU_LIBRARY[launch.library](launch))
        else:
            function = getattr(library, launch.entry)
            function.restype = None
            functions.append(function)
    return functions


def cuda_functions(artifact: str, launches: Sequence[Launch]) -> list[Any]:
    """What each launch calls: its kernel in the module at ``artifact`` (with the dynamic shared memory limit raised
    where it needs more than the default), or the vendor library routine it names."""
    module = cuda.load(artifact)
    functions = [_LIBRARY[launch.library](launch) if launch.library else module.get_function(launch.entry)
                 for launch in launches]
    for function, launch in zip(functions, launches, strict=True):
        if launch.shared_bytes > DEFAULT_SHARED_LIMIT and not launch.library:
            function.max_dynamic_shared_size_bytes = launch.shared_bytes
    return functions
_BACKENDS: dict[str, Callable[[], CpuBackend | CudaBackend]] = {"cpu": CpuBackend, "cuda": CudaBackend}


def execute(message: dict[str, Any], problem: LoadedProblem) -> tuple[RunResult, bool]:
    """Run one trial: (result, whether the worker must exit after it)."""
    try:
        launches = [Launch.from_json(data) for data in message["launches"]]
        backend = _BACKENDS[message["backend"]]()
    except Exception as e:  # a malformed message: nothing ran
        return RunResult.failure("launch", f"{type(e).__name__}: {e}"), False
    try:
        call, fetch = backend.bind(message["artifact"], launches, backend.arrays(launches, problem))
        # a library routine may load its kernel in its first call (a generated module's are loaded when bound)
        checked_s = backend.call_seconds(call, gated=not any(launch.library for launch in launches))
        outputs = fetch()
        worst = 0.0
        written = [b for b in buffers_of(launches) if b.kind == "output"]
        unwritten = sorted(set(problem.reference) - {b.name for b in written})
        if unwritten:
            return RunResult.failure("wrong", f"no output buffer of the launches holds output {unwritten[0]!r}"), False
        tf32 = computes_in_tf32(launches)
        for b in written:
            if b.name not in problem.reference:
                raise ValueError(f"the problem has no reference for output buffer {b.name!r}")
            reference = backend.reference(problem, b.name)
            output = to_float(outputs[b.name], b.dtype, reference.dtype)
            kind, error, text = _checked(output, reference, b, message["tolerance"][b.name], problem, tf32, backend.xp)
            if kind == "wrong" and error is not None and problem.raise_tolerances():  # a raised tolerance may admit it
                kind, error, text = _checked(output, reference, b, message["tolerance"][b.name], problem, tf32,
                                             backend.xp)
            if kind is not None:
                return RunResult.failure(kind, f"output {b.name!r}: {text}", error), False
            worst = max(worst, error or 0.0)
    except Exception as e:  # any failure to load, bind, launch or fetch is this candidate's result
        return RunResult.failure("launch", f"{type(e).__name__}: {e}"), not backend.usable()
    slower_than = message.get("slower_than_s")
    if slower_than is not None and checked_s > slower_than + FIRST_CALL_ALLOWANCE_S and backend.first_call_is_steady \
            and not any(launch.library for launch in launches):
        # out of the running by the call that was checked (a library routine's first call may do work once:
        # cuDNN's benchmark search, a plan built)
        return RunResult(ok=True, median_s=checked_s, min_s=checked_s, repeats=1, max_rel_err=worst), False
    try:
        # a second call, past a library's first-call work, says how long one takes
        call_s = backend.call_seconds(call, gated=not needs_torch(launch.library for launch in launches))
        if slower_than is not None and call_s > slower_than:  # out of the running: that one call is its time
            return RunResult(ok=True, median_s=call_s, min_s=call_s, repeats=1, max_rel_err=worst), False
        times = np.array(backend.time(call, message["warmup"], message["repeats"], call_s))
    except Exception as e:
        return RunResult.failure("launch", f"{type(e).__name__} while timing: {e}"), not backend.usable()
    q1, median, q3 = np.percentile(times, [25, 50, 75])
    return RunResult(ok=True, median_s=float(median), iqr_s=float(q3 - q1), min_s=float(times.min()),
                     repeats=len(times), max_rel_err=worst), False


def _checked(output: Any, reference: Any, b: Buffer, tolerance: float, problem: LoadedProblem, tf32: bool,
             xp: Any) -> tuple[str | None, float | None, str]:
    """:func:`check` at the larger of the trial's tolerance and what building the problem raised (for a TF32 trial,
    its TF32 tolerance)."""
    own = problem.tf32 if tf32 else problem.tolerance
    return check(output, reference, max(tolerance, own.get(b.name, 0.0)), xp, dtype=b.dtype)


#: What a ``prepare`` message can ask the worker to warm while it waits: the libraries whose first call loads slowly.
WARM: dict[str, Callable[[], None]] = {"cudnn": vendor_torch.warm_cudnn}


def _open_cuda() -> None:
    """CuPy imported, the CUDA context made and the output check's kernels compiled: what a worker's first cuda trial
    or problem otherwise waits for (a second or more on a fresh machine)."""
    import cupy

    cupy.cuda.Device(0).synchronize()
    device_check.warm()


#: What a worker can be told to load as it starts (``Worker.warm``), or later (a ``load`` message), in order, on a
#: thread (:func:`_load`): host work, which overlaps the caller's own and the problems the worker builds ahead.
#: ``cuda``: CuPy and the CUDA context (:func:`_open_cuda`); ``cupy``: CuPy's modules alone, no context (a spare
#: worker's, ``transforms.run.SPARE_LOADS``); ``problems``: what a problem sent as a spec is built with;
#: ``problem-kernels``: the CuPy kernels every problem built on the GPU runs (``transforms.problem.warm_device``,
#: after ``cuda``); ``torch``: what a library convolution's trials need (1.5-2.8 s on an H200 machine), which wait for
#: the loads to end, and what the problems built once it is in take their references from (``problem_steps``'s
#: ``torch_reference``). The other trials run beside them, timed behind the gate: ungated, the import held the
#: interpreter between a CUDA event and a launch (a 55 us GEMM timed at 316 us, a 23 us kernel's first call at 5.3 ms).
LOADS: dict[str, Callable[[], object]] = {
    "cuda": _open_cuda,
    "cupy": lambda: importlib.import_module("cupy"),
    "problems": lambda: importlib.import_module("transforms.problem"),
    "problem-kernels": lambda: importlib.import_module("transforms.problem").warm_device(),
    "torch": lambda: importlib.import_module("torch"),
}
#: The loads this process has done (a load that failed is not in it).
LOADED: set[str] = set()
#: How long an idle worker waits for a message before it looks again whether its imports have ended (it warms the
#: libraries only then: a warm-up that imported torch itself would hold the worker until the import ends).
LOADING_POLL_S = 0.05


class Loading(Protocol):
    """The imports under way (a ``threading.Thread``)."""

    def is_alive(self) -> bool: ...

    def join(self) -> None: ...


def _warm(name: str) -> None:
    with contextlib.suppress(Exception):  # the trial that calls the library says what is wrong
        WARM[name]()


def _load(names: Sequence[str]) -> None:
    """Load what ``names`` name (:data:`LOADS`). A load that fails fails again in the trial that needs it, which
    reports it."""
    for name in names:
        if name in LOADS:
            with contextlib.suppress(Exception):
                LOADS[name]()
                LOADED.add(name)


class Loads:
    """The loads under way: the one the worker was started with, and those ``load`` messages started since."""

    def __init__(self, first: Loading | None) -> None:
        self.threads: list[Loading] = [first] if first is not None else []

    def start(self, names: Sequence[str]) -> None:
        thread = threading.Thread(target=_load, args=(names,))
        thread.start()
        self.threads.append(thread)

    def is_alive(self) -> bool:
        return any(thread.is_alive() for thread in self.threads)

    def join(self) -> None:
        for thread in self.threads:
            thread.join()


#: Problems built ahead of their first trial that the worker holds at most (each keeps its arrays on the device).
AHEAD = 4


class Problems:
    """The problem trials run on now, and those a ``prepare`` message said come next (``Worker.prepare``): built in
    order, at most :data:`AHEAD` at a time, a step at a time (``LoadedProblem.open_steps``) while no message waits,
    so a trial finds its problem built and a message that arrives during a build waits for one step of it. A problem
    that fails to build ahead is built again when a trial asks for it, which then fails with the reason."""

    def __init__(self) -> None:
        self.current: LoadedProblem | None = None
        self.coming: dict[str, tuple[str | dict[str, Any], str]] = {}  # key -> (source, backend), in order
        self.built: dict[str, LoadedProblem] = {}
        self.building: tuple[str, Generator[None, None, LoadedProblem]] | None = None  # (key, its steps left)
        self.ahead = 0  # problems a trial found built ahead

    def prepare(self, sources: Sequence[str | dict[str, Any]], backend: str) -> None:
        """Expect ``sources`` next (replacing what was expected); those already built, or being built, stay."""
        self.coming = {_key(s): (s, backend) for s in sources}
        self.built = {k: p for k, p in self.built.items() if k in self.coming}
        if self.building is not None and self.building[0] not in self.coming:
            self.building = None

    def pending(self) -> bool:
        """Whether a problem is waiting to be built ahead, or to be built further."""
        return len(self.built) < AHEAD and any(k not in self.built for k in self.coming)

    def build_next(self) -> None:
        """One step of building the next problem ahead."""
        key = self.building[0] if self.building else next(k for k in self.coming if k not in self.built)
        try:
            if self.building is None:
                source, backend = self.coming[key]
                self.building = (key, LoadedProblem.open_steps(source, _BACKENDS[backend]().xp))
            next(self.building[1])
        except StopIteration as done:
            self.building, self.built[key] = None, done.value
        except Exception:  # built again, and its failure reported, when a trial asks for it
            self.building = None
            del self.coming[key]

    def get(self, source: str | dict[str, Any], backend: str) -> LoadedProblem:
        """The problem a trial names: the current one, one built ahead (or the rest of its build), or built now."""
        if self.current is None or source != self.current.source:
            self.current = None  # free the last problem's arrays (and device copies) first
            key = _key(source)
            self.coming.pop(key, None)
            self.current = self.built.pop(key, None)
            if self.current is not None:
                self.ahead += 1
            elif self.building is not None and self.building[0] == key:
                steps, self.building = self.building[1], None
                self.current = finish(steps)
            else:
                self.current = LoadedProblem.open(source, _BACKENDS[backend]().xp)
        return self.current


def _key(source: str | dict[str, Any]) -> str:
    return json.dumps(source, sort_keys=True)


def main() -> None:
    """Serve trial and ``prepare`` messages on stdin until it closes (:func:`serve`). Kernel output on stdout is
    redirected to stderr."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def reply(data: dict[str, Any]) -> None:
        protocol.write(json.dumps(data) + "\n")
        protocol.flush()

    reply({"ready": True})
    loads = Loads(None)
    loads.start(sys.argv[1:])
    serve(JsonLines(sys.stdin.fileno()), reply, loads=loads)
    loads.join()  # an import cut short by the interpreter's shutdown fails noisily


def serve(lines: JsonLines, reply: Callable[[dict[str, Any]], None], *, loads: Loads | None = None) -> None:
    """Answer each message of ``lines``; while none waits, build the prepared problems, then, once the loads
    (``loads``, which ``load`` messages add to) have ended, warm the libraries the last ``prepare`` named (each
    once). A trial of a library routine run through PyTorch waits for the loads (:data:`LOADS`,
    :func:`_waits_for_imports`)."""
    problems = Problems()
    loads = loads or Loads(None)
    warming: list[str] = []
    warmed: set[str] = set()
    while not lines.closed:
        warm_now = bool(warming) and not loads.is_alive()
        message = lines.next(0 if problems.pending() or warm_now else LOADING_POLL_S if warming else None)
        if message is None:
            if problems.pending():
                problems.build_next()
            elif warm_now:
                _warm(warming.pop(0))
            continue
        if "prepare" in message:
            problems.prepare(message["prepare"], message["backend"])
            warming = [name for name in message.get("warm", ()) if name in WARM and name not in warmed]
            warmed.update(warming)
            reply({"ahead": problems.ahead})
            continue
        if "load" in message:
            loads.start([name for name in message["load"] if name in LOADS])
            reply({"ahead": problems.ahead})
            continue
        try:
            problem = problems.get(message["problem"], message["backend"])
        except Exception as e:  # a missing file, a bad spec, a GPU out of memory: this trial's result
            failure = RunResult.failure("launch", f"cannot load the problem: {type(e).__name__}: {e}")
            reply({**failure.to_json(), "fatal": False})
            continue
        if _waits_for_imports(message):
            loads.join()
        result, fatal = execute(message, problem)
        reply({**result.to_json(), "fatal": fatal})
        if fatal:
            return


def _waits_for_imports(message: dict[str, Any]) -> bool:
    """Whether a trial waits for the worker's imports: one with a library routine run through PyTorch (the others
    are timed behind the gate, whatever the imports' thread holds), or a malformed one (``execute`` says why)."""
    launched = message.get("launches")
    if not isinstance(launched, list):
        return True
    return needs_torch(d.get("library") for d in launched if isinstance(d, dict))


if __name__ == "__main__":
    main()
