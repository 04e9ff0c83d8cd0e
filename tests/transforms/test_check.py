"""The correctness check (``transforms.worker.check``) against its documented contract, derived here independently:
element i errs by ``|out_i - ref_i| / max(|ref_i|, floor)``, floor = max(1e-3 * max_j |ref_j|, the smallest normal
number of the output's dtype); the output is wrong past the tolerance; non-finite values compare exactly. Then every
output of a real two-output cpu kernel through the worker."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gpu import needs_gpu
from transforms import run as runner
from transforms.build import Source, build
from transforms.run import Buffer, Launch, Problem, Scalar, Trial, Worker, run
from transforms.worker import check

#: (output buffer dtype, reference dtype, tolerance): the pairs the runner uses (fp16/bf16 against float32).
DTYPES = [("float64", np.float64, 1e-9), ("float32", np.float64, 1e-4), ("float32", np.float64, 4e-4),
          ("float16", np.float32, 1e-2), ("bfloat16", np.float32, 3e-2)]
SMALLEST_NORMAL = {"float64": 2.2250738585072014e-308, "float32": 1.1754943508222875e-38,
                   "float16": 6.103515625e-05, "bfloat16": 1.1754943508222875e-38}


def bounds(reference: np.ndarray, dtype: str, tolerance: float) -> np.ndarray:
    """The largest error each element may have (float64), from the contract above."""
    magnitude = np.abs(reference.astype(np.float64))
    floor = max(1e-3 * magnitude.max(), SMALLEST_NORMAL[dtype])
    return tolerance * np.maximum(magnitude, floor)


@st.composite
def references(draw):
    """A reference of magnitudes 1e-6 .. 1e6 (spread up to 9 decades within one array), any signs, some zeros."""
    dtype, float_dtype, tolerance = draw(st.sampled_from(DTYPES))
    n = draw(st.integers(1, 40))
    low = draw(st.floats(-6, 6))
    span = draw(st.floats(0, 9))
    exponents = draw(st.lists(st.floats(low, low + span), min_size=n, max_size=n))
    signs = draw(st.lists(st.sampled_from([-1.0, 0.0, 1.0, 1.0, -1.0]), min_size=n, max_size=n))
    if not any(signs):
        signs[0] = 1.0
    values = np.array(signs) * 10.0 ** np.array(exponents)
    if dtype in ("float16", "bfloat16"):
        values = runner.quantize(values.clip(-6e4, 6e4), dtype)  # an fp16 output cannot hold more
    return dtype, values.astype(float_dtype), tolerance


def perturbed(reference: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    return (reference.astype(np.float64) + offsets).astype(reference.dtype)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(references(), st.data())
def test_errors_just_inside_the_tolerance_pass(case, data):
    dtype, reference, tolerance = case
    unit = np.array(data.draw(st.lists(st.floats(-0.9, 0.9), min_size=reference.size, max_size=reference.size)))
    offsets = unit * bounds(reference, dtype, tolerance)
    kind, error, message = check(perturbed(reference, offsets), reference, tolerance, dtype=dtype)
    assert kind is None, message
    assert error <= 0.91 * tolerance


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(references(), st.data())
def test_one_element_just_outside_the_tolerance_fails(case, data):
    dtype, reference, tolerance = case
    bad = data.draw(st.integers(0, reference.size - 1))
    sign = data.draw(st.sampled_from([-1.0, 1.0]))
    offsets = np.zeros(reference.size)
    offsets[bad] = sign * 1.1 * bounds(reference, dtype, tolerance)[bad]
    kind, error, message = check(perturbed(reference, offsets), reference, tolerance, dtype=dtype)
    assert kind == "wrong", f"{bad}: {reference[bad]!r} + {offsets[bad]!r} passed"
    assert error == pytest.approx(1.1 * tolerance, rel=0.02)
    assert f"exceeds the tolerance {tolerance:g}" in message


@settings(max_examples=200, deadline=None)
@given(references(), st.data())
def test_a_non_finite_output_never_passes_where_the_reference_is_finite(case, data):
    dtype, reference, tolerance = case
    output = reference.copy()
    bad = data.draw(st.lists(st.integers(0, reference.size - 1), min_size=1, unique=True))
    output[bad] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    kind, _, message = check(output, reference, tolerance, dtype=dtype)
    assert kind == "nan" and message.startswith(f"{len(bad)} of {reference.size} elements are NaN or infinite")


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64])
def test_non_finite_references_are_matched_exactly(float_dtype):
    reference = np.array([np.inf, -np.inf, 2.0, np.nan], dtype=float_dtype)
    values = lambda *v: np.array(v, dtype=float_dtype)  # noqa: E731
    assert check(values(np.inf, -np.inf, 2.0, np.nan), reference, 1.0)[0] == "nan"  # NaN never passes
    finite_reference = reference[:3]
    assert check(values(np.inf, -np.inf, 2.0), finite_reference, 1e-9)[0] is None
    assert check(values(-np.inf, -np.inf, 2.0), finite_reference, 1.0)[0] == "nan"  # the other infinity
    assert check(values(np.nan, -np.inf, 2.0), finite_reference, 1.0)[0] == "nan"
    assert check(values(1e30, -np.inf, 2.0), finite_reference, 1.0)[0] == "wrong"  # finite where it is not
    assert check(values(np.inf, -np.inf, 2.0), values(np.inf, -np.inf, np.nan), 1.0)[0] == "wrong"
    # the infinities take no part in the scale the finite elements are measured against
    assert check(values(np.inf, -np.inf, 3.0), finite_reference, 1e-4)[:2] == ("wrong", pytest.approx(0.5))


def test_a_softmax_five_percent_off_fails_at_any_scale():
    logits = np.random.default_rng(0).standard_normal(1000)
    softmax = np.exp(logits) / np.exp(logits).sum()  # values about 1e-3, all well under 1
    assert softmax.max() < 0.02
    kind, error, _ = check(softmax * 1.05, softmax, 1e-4, dtype="float32")
    assert kind == "wrong" and error == pytest.approx(0.05)
    for scale in (1e-6, 1e-3, 1.0, 1e6):
        assert check(scale * softmax * (1 + 5e-5), scale * softmax, 1e-4)[0] is None
        assert check(scale * softmax * 1.05, scale * softmax, 1e-4)[0] == "wrong"


def test_elements_near_zero_are_measured_against_a_thousandth_of_the_largest():
    reference = np.array([1000.0, 1e-9, 0.0])
    assert check(np.array([1000.0, 0.9e-4, 0.0]), reference, 1e-4)[1] == pytest.approx(0.9e-4, rel=1e-3)
    assert check(np.array([1000.0, 1e-9, 1.1e-4]), reference, 1e-4)[0] == "wrong"  # 1.1e-4 / (1e-3 * 1000)
    small = np.array([1.0, 1e-3, 1e-3])  # at the floor exactly, the element's own magnitude counts
    assert check(small * np.array([1, 1 + 1.1e-4, 1]), small, 1e-4)[0] == "wrong"


def test_an_fp16_output_below_its_smallest_normal_is_held_to_absolute_precision():
    reference = np.array([3e-7, -2e-6, 1e-6], dtype=np.float32)  # fp16 subnormals: steps of 6e-8
    stored = runner.quantize(reference, "float16").astype(np.float32)
    assert check(stored, reference, 1e-2, dtype="float16")[0] is None
    assert check(reference + np.float32(1.1e-2 * 6.104e-5), reference, 1e-2, dtype="float16")[0] == "wrong"


def test_an_all_zero_reference_must_be_matched_exactly_up_to_the_smallest_normal():
    assert check(np.zeros(4), np.zeros(4), 1e-4)[0] is None
    assert check(np.array([0.0, 1e-300, 0.0, 0.0]), np.zeros(4), 1e-4)[0] == "wrong"


def test_a_nan_tolerance_is_an_error_not_a_pass():
    with pytest.raises(ValueError, match="tolerance must be a number"):
        check(np.ones(2), np.zeros(2), float("nan"))


N = 512
TWO = """#include <math.h>
void two(const float* x, float* y, float* p, int n) {{
    float total = 0.0f;
    for (int i = 0; i < n; i++) total += expf(x[i]);
    for (int i = 0; i < n; i++) {{ y[i] = {y}; p[i] = {p}; }}
}}"""
KERNELS = {
    "correct": TWO.format(y="2.0f * x[i]", p="expf(x[i]) / total"),
    "first_wrong": TWO.format(y="2.0f * x[i] + (i == 7 ? 1.0f : 0.0f)", p="expf(x[i]) / total"),
    "second_wrong": TWO.format(y="2.0f * x[i]", p="1.05f * expf(x[i]) / total"),  # a softmax 5% off
    "second_unwritten": TWO.format(y="2.0f * x[i]", p="(i == n - 1 ? p[i] : expf(x[i]) / total)"),
}
X, Y, P = Buffer("x", (N,), "float32"), Buffer("y", (N,), "float32", "output"), Buffer("p", (N,), "float32", "output")


@pytest.fixture(scope="module")
def two_outputs(tmp_path_factory):
    built = build([Source(code) for code in KERNELS.values()], cache_dir=tmp_path_factory.mktemp("cache"))
    x = runner.quantize(np.random.default_rng(1).standard_normal(N), "float32")
    problem = Problem({"x": x}, {"y": 2 * x, "p": np.exp(x) / np.exp(x).sum()})
    with Worker() as worker:
        yield dict(zip(KERNELS, built, strict=True)), problem, worker


@pytest.mark.parametrize(("name", "kind", "says"), [
    ("correct", None, None),
    ("first_wrong", "wrong", "output 'y': max relative error"),
    ("second_wrong", "wrong", "output 'p': max relative error 0.05 exceeds"),
    ("second_unwritten", "nan", "output 'p': 1 of 512 elements are NaN"),
])
def test_every_output_of_a_two_output_kernel_is_checked(two_outputs, name, kind, says):
    built, problem, worker = two_outputs
    [result] = run([Trial(built[name], Launch("two", (X, Y, P, Scalar("n", N))), problem)], worker=worker, repeats=2)
    assert result.error_kind == kind and result.ok == (kind is None)
    if says:
        assert says in result.error


def test_an_output_the_launches_do_not_hold_is_not_skipped(two_outputs):
    built, problem, worker = two_outputs
    p_as_scratch = Buffer("p", (N,), "float32", "scratch")
    [result] = run([Trial(built["second_wrong"], Launch("two", (X, Y, p_as_scratch, Scalar("n", N))), problem)],
                   worker=worker, repeats=2)
    assert result.error_kind == "wrong" and "holds output 'p'" in result.error


def test_shapes_must_match_not_broadcast():
    assert check(np.zeros((4, 1)), np.zeros(4), 1.0)[0] == "wrong"
    assert check(np.zeros((2, 2)), np.zeros(4), 1.0)[0] == "wrong"


def test_an_integer_output_is_checked_against_an_integer_reference():
    # a problem built on the GPU keeps an integer output's reference in its own dtype (an embedding's offset indices)
    reference = np.array([[0, 1000, 2000], [7, 1007, 2999]], dtype=np.int64)
    assert check(reference.copy(), reference, 0.0, dtype="int64") == (None, 0.0, "")
    off = reference.copy()
    off[1, 2] = 2998  # one index off: |2998 - 2999| / 2999
    kind, worst, _ = check(off, reference, 1e-5, dtype="int64")
    assert kind == "wrong" and worst == pytest.approx(1 / 2999)


@needs_gpu
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(references(), st.data())
def test_the_device_check_decides_as_the_host_check(case, data):
    import cupy as cp

    dtype, reference, tolerance = case
    unit = np.array(data.draw(st.lists(st.floats(-3, 3), min_size=reference.size, max_size=reference.size)))
    output = perturbed(reference, unit * bounds(reference, dtype, tolerance))
    for array in data.draw(st.lists(st.sampled_from([output, reference]), max_size=3)):
        array[data.draw(st.integers(0, reference.size - 1))] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    if data.draw(st.booleans()) and reference.dtype == np.float64:
        output = output.astype(np.float32)  # dtypes that differ: both compared in float64
    host = check(output, reference, tolerance, dtype=dtype)
    assert check(cp.asarray(output), cp.asarray(reference), tolerance, cp, dtype=dtype) == host


@needs_gpu
@pytest.mark.parametrize("float_dtype", [np.float32, np.float64])
def test_the_device_check_sees_one_element_of_millions(float_dtype):
    import cupy as cp

    reference = np.random.default_rng(2).standard_normal(3_000_017).astype(float_dtype)
    output = reference * float_dtype(1 + 1e-6)
    output[-1] = reference[-1] + 0.25 * max(abs(reference[-1]), 1e-3 * np.abs(reference).max())  # the last element
    on_device = cp.asarray(output), cp.asarray(reference)
    kind, worst, _ = check(*on_device, 1e-2, cp)
    assert kind == "wrong" and worst == pytest.approx(0.25, rel=1e-5)
    output[1_234_567] = -np.inf
    assert check(cp.asarray(output), on_device[1], 1.0, cp)[:2] == ("nan", pytest.approx(0.25, rel=1e-5))
    output[2_345_678] = reference[2_345_678] = np.nan  # NaN never passes, not even against NaN
    assert check(cp.asarray(output), cp.asarray(reference), 1.0, cp)[2].startswith("2 of 3000017 elements")
