"""The validation problem of a task: inputs in their storage dtypes, references in a precision the outputs need."""

import numpy as np
import pytest

from embed.builder import GraphBuilder
from embed.evaluate import evaluate
from embed.lower import lower
from transforms.run import to_float
from transforms.tune import make_problem, reference_dtype


def _softmax(dtype: str, shape: tuple[int, int] = (64, 96)):
    b = GraphBuilder("s")
    x = b.input("x", shape, dtype)
    return b.build([b.node("softmax", [x], shape, dtype, name="out", axis=-1)])


@pytest.mark.parametrize(("dtype", "storage", "precision"), [
    ("float16", np.float16, np.float32), ("bfloat16", np.uint16, np.float32), ("float32", np.float32, np.float64)])
def test_inputs_are_stored_in_their_dtype_and_low_precision_outputs_get_a_float32_reference(dtype, storage, precision):
    graph = _softmax(dtype)
    program = lower(graph)
    problem = make_problem(graph, program)
    [stored] = problem.inputs.values()
    [reference] = problem.reference.values()
    assert stored.dtype == storage and reference.dtype == precision and reference_dtype(program) is precision
    exact = evaluate(program, {"x": to_float(stored, dtype)})["out"]  # float64 from the same stored inputs
    assert np.max(np.abs(reference - exact) / np.abs(exact)) < 1e-6


def test_random_inputs_do_not_depend_on_the_thread_count(monkeypatch):
    graph = _softmax("float16", (1024, 3000))  # three blocks of drawn values
    first = make_problem(graph, lower(graph)).inputs
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    again = make_problem(graph, lower(graph)).inputs
    assert all(np.array_equal(first[k], again[k]) for k in first)
