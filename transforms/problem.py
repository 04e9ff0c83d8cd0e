"""The validation problem of a subgraph: random inputs in their buffers' storage dtypes, reference outputs from
``embed.evaluate`` (float32 or float64: :func:`reference_dtype`) and per-output tolerances, keyed by argument name.

    problem = make_problem(graph, program, seed=0)         # host arrays
    problem = described_problem(graph, program, seed=0)    # a spec; host arrays only when read
    problem = problem_from_spec(problem.spec, cupy)        # what a cuda worker does with the spec: arrays on its GPU

The arrays are built with an array module ``xp``, NumPy or CuPy, by the same code and the same rules
(``embed.inputs``). Integer inputs, and so the tolerances, are the same either way; float inputs come from another
generator on the GPU (deterministic per graph and seed), so their values, and the references, differ from the
host's. On the GPU the references can come from PyTorch instead (``torch_reference``): the graph run eagerly in the
reference's dtype (``embed.eager.run_eager``), which agrees with the evaluator to 1e-9 over the zoo
(``tests/embed/test_evaluate.py``) and runs kernels compiled ahead, where CuPy compiles each of the evaluator's
element-wise kernels (one per op, dtypes and rank) at its first use on a machine: 0.05-0.3 s apiece, 18-29 of them in
one model's first optimize on a fresh H200 machine (``bench/README.md``).
"""

import json
import math
from collections.abc import Callable, Generator, Mapping
from typing import Any

import numpy as np

from embed.blocks import converted
from embed.errors import EmbedError
from embed.evaluate import evaluate_steps, numpy_dtype
from embed.inputs import random_inputs
from embed.ir import Graph, validated
from embed.loopnest import Dim, Indirect, LoopNest, LoopProgram
from embed.lower import lower
from transforms.codegen.kernel import compute_dtype
from transforms.codegen.signature import run_dtype, signature
from transforms.convolution import match_convolution
from transforms.run import STORAGE, TOLERANCE, Problem, finish, to_float, to_storage

#: A float32 output may err this many times what the program evaluated plainly in float32 errs (another order of
#: summation errs by about as much; a wrong kernel errs by orders of magnitude more).
PLAIN_FLOAT32_FACTOR = 4.0


def stored_inputs(graph: Graph, program: LoopProgram, *, seed: int = 0, xp: Any = np) -> dict[str, Any]:
    """Random inputs by graph name in their buffer dtypes' storage form (:func:`~transforms.run.to_storage`), as
    arrays of ``xp``."""
    raw = random_inputs(graph, seed=seed, xp=xp)
    dtypes = {n: run_dtype(program.buffers[n].dtype) for n in program.inputs}
    return {n: converted(raw[n], lambda v, d=dtypes[n]: to_storage(v, d, xp), STORAGE[dtypes[n]], xp) for n in dtypes}


def quantized_inputs(graph: Graph, program: LoopProgram, *, seed: int = 0,
                     float_dtype: type[np.floating] = np.float64) -> dict[str, np.ndarray]:
    """Random inputs by graph name, rounded to their buffer dtypes (as ``float_dtype`` values)."""
    return _values(program, stored_inputs(graph, program, seed=seed), float_dtype)


def _values(program: LoopProgram, stored: Mapping[str, Any], float_dtype: type[np.floating], xp: Any = np) \
        -> dict[str, Any]:
    dtypes = {n: run_dtype(program.buffers[n].dtype) for n in stored}
    return {n: converted(v, lambda a, d=dtypes[n]: to_float(a, d, float_dtype), float_dtype, xp)
            for n, v in stored.items()}


def reference_dtype(program: LoopProgram) -> type[np.floating]:
    """float32 when every float output is float16 / bfloat16 and no float buffer is float64 (float32 rounding
    is then far below the outputs' tolerance), else float64."""
    dtypes = {run_dtype(b.dtype) for b in program.buffers.values() if b.dtype.is_float}
    outputs = {run_dtype(program.buffers[n].dtype) for n in program.outputs if program.buffers[n].dtype.is_float}
    low = outputs and outputs <= {"float16", "bfloat16"} and "float64" not in dtypes
    return np.float32 if low else np.float64


def make_problem(graph: Graph, program: LoopProgram, *, seed: int = 0, xp: Any = np) -> Problem:
    """Random inputs (in their storage dtypes), reference outputs (float32 or float64: :func:`reference_dtype`) and
    tolerances, as arrays of ``xp`` (NumPy, or CuPy: built on the GPU)."""
    problem, raise_tolerances = make_problem_lazily(graph, program, seed=seed, xp=xp)
    problem.tolerance, problem.tf32 = raise_tolerances()
    return problem


RaiseTolerances = Callable[[], tuple[dict[str, float], dict[str, float]]]


def make_problem_lazily(graph: Graph, program: LoopProgram, *, seed: int = 0, xp: Any = np) \
        -> tuple[Problem, RaiseTolerances]:
    """:func:`make_problem`'s problem with the dtype's tolerances only, and the function that computes its raised
    ones, (float32 tolerance, TF32 tolerance) by output: what a plain float32 evaluation errs (and, for a convolution,
    one with TF32-rounded operands) costs another evaluation of the program, which only a candidate that fails the
    dtype's tolerance needs (the raised tolerances are never below it)."""
    return finish(problem_steps(graph, program, seed=seed, xp=xp))


def problem_steps(graph: Graph, program: LoopProgram, *, seed: int = 0, xp: Any = np,
                  torch_reference: bool = False) -> Generator[None, None, tuple[Problem, RaiseTolerances]]:
    """:func:`make_problem_lazily` a step at a time: yields once the inputs are drawn, then after each nest of the
    reference (``embed.evaluate.evaluate_steps``), so a worker building it ahead answers a message meanwhile. With
    ``torch_reference`` the references are PyTorch's where the graph runs eagerly (on the arrays' device: what a cuda
    worker that has imported torch asks for)."""
    sig = signature(program, compute_dtype(program))
    stored = stored_inputs(graph, program, seed=seed, xp=xp)
    yield
    precision = reference_dtype(program)
    values = _values(program, stored, precision, xp)
    evaluation = _Evaluation(graph, program, xp, torch_reference)
    reference = yield from evaluation.steps(values, precision)
    inputs = {sig.names[n]: stored[n] for n in program.inputs if n in sig.names}
    outputs = {sig.names[n]: reference[n] for n in program.outputs}
    tolerance = tolerances(program, sig.names, values)

    def raise_tolerances() -> tuple[dict[str, float], dict[str, float]]:
        if precision is not np.float64:
            return dict(tolerance), {}
        plain = _values(program, stored, np.float32, xp)
        raised = _raised(evaluation, sig.names, plain, reference, tolerance)
        conv = match_convolution(program)
        if conv is None:
            return raised, {}
        # what eager's own TF32 convolution errs: its operands rounded as the tensor cores do
        rounded = {n: to_tf32(v, xp) if n in (conv.x, conv.w) else v for n, v in plain.items()}
        return raised, _raised(evaluation, sig.names, rounded, reference, {})

    return Problem(inputs, outputs, dict(tolerance), {}), raise_tolerances


class _Evaluation:
    """A problem's program evaluated on its inputs: by ``embed.evaluate`` (arrays of ``xp``), or, ``on_torch``, by
    PyTorch running the graph where the arrays are (:func:`_eager_reference`) unless the graph does not run eagerly
    there (an op PyTorch refuses, its memory, outputs named otherwise than the program's), which the evaluator then
    does."""

    def __init__(self, graph: Graph, program: LoopProgram, xp: Any, on_torch: bool) -> None:
        self.graph, self.program, self.xp, self.on_torch = graph, program, xp, on_torch

    def steps(self, values: Mapping[str, Any], float_dtype: type[np.floating]) \
            -> Generator[None, None, dict[str, Any]]:
        """The outputs by buffer name, floats in ``float_dtype``: a step a nest (the evaluator), or at once."""
        if self.on_torch and set(self.graph.outputs) == set(self.program.outputs):
            try:
                return _eager_reference(self.graph, self.program, values, float_dtype, self.xp)
            except (EmbedError, RuntimeError, BufferError):  # the evaluator chunks what does not fit
                self.on_torch = False
        return (yield from evaluate_steps(self.program, values, float_dtype, self.xp))

    def __call__(self, values: Mapping[str, Any], float_dtype: type[np.floating]) -> dict[str, Any]:
        return finish(self.steps(values, float_dtype))


def _eager_reference(graph: Graph, program: LoopProgram, values: Mapping[str, Any], float_dtype: type[np.floating],
                     xp: Any) -> dict[str, Any]:
    """The graph run by PyTorch on ``values`` (arrays of ``xp``, NumPy or CuPy, shared through DLPack), floats computed
    in ``float_dtype`` without TF32 (which cuDNN's convolutions use by default) and without cuDNN's benchmark search;
    the outputs as the evaluator gives them: contiguous arrays of ``xp`` in its dtypes (``numpy_dtype``)."""
    import torch

    from embed.eager import run_eager

    tensors = {n: torch.from_dlpack(v) for n, v in values.items()}
    float_torch = torch.float64 if float_dtype is np.float64 else torch.float32
    matmul_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=False, allow_tf32=False):
            outputs = run_eager(graph, tensors, compute_dtype=float_torch)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
    dtypes = {n: numpy_dtype(program.buffers[n].dtype, float_dtype) for n in program.outputs}
    as_torch = {np.float64: torch.float64, np.float32: torch.float32, np.int64: torch.int64, np.bool_: torch.bool}
    # one copy each: contiguous, and never a view of an input (a layout op's output is one)
    return {n: xp.from_dlpack(t.to(as_torch[dtypes[n]], memory_format=torch.contiguous_format, copy=True))
            for n, t in outputs.items()}


def warm_device() -> None:
    """Compile now the CuPy kernels that every problem built on this process's GPU runs whatever its graph, which its
    first problem would otherwise wait for: the random inputs' module (``embed.device_inputs``) and the element-wise
    conversions of contiguous float32 arrays (to float64, copied, filled, rounded to TF32), once a machine an NVRTC
    compile each (0.2-0.3 s on a fresh H200 machine), then read from CuPy's disk cache."""
    import cupy as cp

    from embed import device_inputs

    device_inputs.warm()
    values = cp.ones(4, dtype=cp.float32)
    to_float(values, "float32", np.float64)
    values.copy()
    cp.full(4, np.nan, np.float32)
    to_tf32(values, cp)


def to_tf32(values: Any, xp: Any = np) -> Any:
    """Float32 ``values`` rounded to TF32's 10-bit mantissa (to nearest, ties to even), as TF32 tensor cores take
    their operands."""
    bits = xp.ascontiguousarray(values, dtype=xp.float32).view(xp.uint32)
    kept = (bits + xp.uint32(0xFFF) + ((bits >> xp.uint32(13)) & xp.uint32(1))) & xp.uint32(0xFFFFE000)
    return kept.view(xp.float32)


def _raised(evaluation: _Evaluation, names: dict[str, str], values: Mapping[str, Any], reference: Mapping[str, Any],
            tolerance: Mapping[str, float]) -> dict[str, float]:
    """Float32 outputs' tolerances raised to :data:`PLAIN_FLOAT32_FACTOR` times the error of the program evaluated
    in float32 on ``values`` (the problem's inputs as float32, or rounded further): the error such a kernel cannot
    avoid where the program amplifies rounding (a batch-norm's normalisation after a convolution), which the
    dtype's tolerance does not foresee."""
    from transforms.worker import check  # the one error measure of validation

    program, xp = evaluation.program, evaluation.xp
    plain = evaluation(values, np.float32)
    raised = dict(tolerance)
    for n in program.outputs:
        name = names[n]
        if run_dtype(program.buffers[n].dtype) == "float32":
            _, error, _ = check(plain[n].astype(reference[n].dtype), reference[n], math.inf, xp, dtype="float32")
            if error is not None and math.isfinite(error):
                raised[name] = max(raised.get(name, 0.0), PLAIN_FLOAT32_FACTOR * error)
    return raised


def described_problem(graph: Graph, program: LoopProgram, *, seed: int = 0) -> Problem:
    """:func:`make_problem`'s problem as a spec (``Problem.described``): a cuda worker builds it on its GPU
    (:func:`problem_from_spec`); its host arrays, :func:`make_problem`'s, are built when first read. ``program``
    is ``lower(graph)`` (the worker lowers the graph again). The tolerances are computed here: they read only the
    index tensors of ragged reductions, integers drawn alike on the host and on the GPU."""
    sig = signature(program, compute_dtype(program))
    index = random_inputs(graph, seed=seed, only={t for n in program.nests for d in n.reduction if (t := _index(d))})
    spec = {"graph": json.loads(graph.to_json()), "seed": seed}
    return Problem.described(spec, tolerances(program, sig.names, index),
                             lambda: make_problem(graph, program, seed=seed))


def problem_from_spec(spec: Any, xp: Any = np, *, torch_reference: bool = False) -> Problem:
    """The problem a spec (``Problem.spec``: ``{"graph": graph document, "seed": int}``) describes, as arrays of
    ``xp`` (``torch_reference``: :func:`problem_steps`); ValueError (``InvalidGraphError`` for the graph) says what is
    wrong with a bad spec."""
    problem, raise_tolerances = finish(problem_from_spec_steps(spec, xp, torch_reference=torch_reference))
    problem.tolerance, problem.tf32 = raise_tolerances()
    return problem


def problem_from_spec_steps(spec: Any, xp: Any = np, *, torch_reference: bool = False) \
        -> Generator[None, None, tuple[Problem, RaiseTolerances]]:
    """:func:`problem_from_spec`'s problem a step at a time, with the raised tolerances computed when asked (as
    :func:`make_problem_lazily` gives them): :func:`problem_steps`, after the graph is lowered."""
    if not isinstance(spec, Mapping) or set(spec) != {"graph", "seed"} or type(spec["seed"]) is not int:
        raise ValueError(f"a problem spec is {{'graph': <graph document>, 'seed': <int>}}, not {str(spec)[:200]}")
    graph = validated(Graph, spec["graph"], "graph of a problem spec")
    program = lower(graph)
    yield
    return (yield from problem_steps(graph, program, seed=spec["seed"], xp=xp, torch_reference=torch_reference))


def tolerances(program: LoopProgram, names: dict[str, str], inputs: Mapping[str, Any] | None = None) \
        -> dict[str, float]:
    """Per-output tolerance: the dtype's, widened by sqrt(longest reduction) / 4 for reassociated sums (a wrong
    term still errs by orders of magnitude more). A ragged (CSR) reduction counts its longest row when
    ``inputs`` (by buffer name; NumPy or CuPy arrays) hold the index tensor, else its mean extent."""
    longest = max((_reduction_length(n, inputs or {}) for n in program.nests), default=1)
    factor = max(1.0, math.sqrt(longest) / 4)
    out = {}
    for n in program.outputs:
        dtype = run_dtype(program.buffers[n].dtype)
        if dtype in TOLERANCE and program.buffers[n].dtype.is_float:
            out[names[n]] = TOLERANCE[dtype] * factor
    return out


def _index(dim: Dim) -> str | None:
    """The tensor a ragged dimension reads its range from (None for a dense one)."""
    return next((a.tensor for a, _ in dim.ragged.start.terms if isinstance(a, Indirect)), None) if dim.ragged else None


def _reduction_length(nest: LoopNest, inputs: Mapping[str, Any]) -> int:
    """Terms summed per output element: ragged dims count the longest ``stop - start`` of their index tensor."""
    length = 1
    for d in nest.reduction:
        tensor = _index(d)
        index = inputs.get(tensor) if tensor else None
        if index is not None and index.size > 1:
            flat = index.ravel()
            length *= max(int((flat[1:] - flat[:-1]).max()), 0)
        else:
            length *= d.extent
    return max(length, 1)
