"""The validation problem of a subgraph: random inputs in their buffers' storage dtypes, reference outputs from
``embed.evaluate`` (float32 or float64: :func:`reference_dtype`) and per-output tolerances, keyed by argument name.

    problem = make_problem(graph, program, seed=0)         # host arrays
    problem = described_problem(graph, program, seed=0)    # a spec; host arrays only when read
    problem = problem_from_spec(problem.spec, cupy)        # what a cuda worker does with the spec: arrays on its GPU

The arrays are built with an array module ``xp``, NumPy or CuPy, by the same code and the same rules
(``embed.inputs``). Integer inputs, and so the tolerances, are the same either way; float inputs come from another
generator on the GPU (deterministic per graph and seed), so their values, and the references, differ from the
host's.
"""

import json
import math
from collections.abc import Callable, Generator, Mapping
from typing import Any

import numpy as np

from embed.blocks import converted
from embed.evaluate import evaluate, evaluate_steps
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


def problem_steps(graph: Graph, program: LoopProgram, *, seed: int = 0, xp: Any = np) \
        -> Generator[None, None, tuple[Problem, RaiseTolerances]]:
    """:func:`make_problem_lazily` a step at a time: yields once the inputs are drawn, then after each nest of the
    reference (``embed.evaluate.evaluate_steps``), so a worker building it ahead answers a message meanwhile."""
    sig = signature(program, compute_dtype(program))
    stored = stored_inputs(graph, program, seed=seed, xp=xp)
    yield
    precision = reference_dtype(program)
    values = _values(program, stored, precision, xp)
    reference = yield from evaluate_steps(program, values, precision, xp)
    inputs = {sig.names[n]: stored[n] for n in program.inputs if n in sig.names}
    outputs = {sig.names[n]: reference[n] for n in program.outputs}
    tolerance = tolerances(program, sig.names, values)

    def raise_tolerances() -> tuple[dict[str, float], dict[str, float]]:
        if precision is not np.float64:
            return dict(tolerance), {}
        plain = _values(program, stored, np.float32, xp)
        raised = _raised(program, sig.names, plain, reference, tolerance, xp)
        conv = match_convolution(program)
        if conv is None:
            return raised, {}
        # what eager's own TF32 convolution errs: its operands rounded as the tensor cores do
        rounded = {n: to_tf32(v, xp) if n in (conv.x, conv.w) else v for n, v in plain.items()}
        return raised, _raised(program, sig.names, rounded, reference, {}, xp)

    return Problem(inputs, outputs, dict(tolerance), {}), raise_tolerances


def to_tf32(values: Any, xp: Any = np) -> Any:
    """Float32 ``values`` rounded to TF32's 10-bit mantissa (to nearest, ties to even), as TF32 tensor cores take
    their operands."""
    bits = xp.ascontiguousarray(values, dtype=xp.float32).view(xp.uint32)
    kept = (bits + xp.uint32(0xFFF) + ((bits >> xp.uint32(13)) & xp.uint32(1))) & xp.uint32(0xFFFFE000)
    return kept.view(xp.float32)


def _raised(program: LoopProgram, names: dict[str, str], values: Mapping[str, Any], reference: Mapping[str, Any],
            tolerance: Mapping[str, float], xp: Any) -> dict[str, float]:
    """Float32 outputs' tolerances raised to :data:`PLAIN_FLOAT32_FACTOR` times the error of the program evaluated
    in float32 on ``values`` (the problem's inputs as float32, or rounded further): the error such a kernel cannot
    avoid where the program amplifies rounding (a batch-norm's normalisation after a convolution), which the
    dtype's tolerance does not foresee."""
    from transforms.worker import check  # the one error measure of validation

    plain = evaluate(program, values, np.float32, xp)
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


def problem_from_spec(spec: Any, xp: Any = np) -> Problem:
    """The problem a spec (``Problem.spec``: ``{"graph": graph document, "seed": int}``) describes, as arrays of
    ``xp``; ValueError (``InvalidGraphError`` for the graph) says what is wrong with a bad spec."""
    problem, raise_tolerances = problem_from_spec_lazily(spec, xp)
    problem.tolerance, problem.tf32 = raise_tolerances()
    return problem


def problem_from_spec_lazily(spec: Any, xp: Any = np) -> tuple[Problem, RaiseTolerances]:
    """:func:`problem_from_spec` as :func:`make_problem_lazily` gives it: the raised tolerances when asked."""
    return finish(problem_from_spec_steps(spec, xp))


def problem_from_spec_steps(spec: Any, xp: Any = np) -> Generator[None, None, tuple[Problem, RaiseTolerances]]:
    """:func:`problem_from_spec_lazily` a step at a time (:func:`problem_steps`, after the graph is lowered)."""
    if not isinstance(spec, Mapping) or set(spec) != {"graph", "seed"} or type(spec["seed"]) is not int:
        raise ValueError(f"a problem spec is {{'graph': <graph document>, 'seed': <int>}}, not {str(spec)[:200]}")
    graph = validated(Graph, spec["graph"], "graph of a problem spec")
    program = lower(graph)
    yield
    return (yield from problem_steps(graph, program, seed=spec["seed"], xp=xp))


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
