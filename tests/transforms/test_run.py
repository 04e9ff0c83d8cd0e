import json
import math
import signal
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from embed.lower import lower
from tests.gpu import needs_gpu
from tests.transforms.kernels import single
from transforms import run as runner
from transforms.build import Source, build
from transforms.compilers import cuda
from transforms.results import BuildResult, RunResult
from transforms.run import Buffer, Launch, Problem, Scalar, Trial, Worker, run
from transforms.space import default_recipe
from transforms.tune import kernels, make_task

N = 4096
SIGNATURE = "void vadd(const float* a, const float* b, float* c, int n)"
KERNELS = {
    "correct": SIGNATURE + "{ for (int i = 0; i < n; i++) c[i] = a[i] + b[i]; }",
    "wrong": SIGNATURE + "{ for (int i = 0; i < n; i++) c[i] = a[i] - b[i]; }",
    "skips_last": SIGNATURE + "{ for (int i = 0; i < n - 1; i++) c[i] = a[i] + b[i]; }",
    "segfault": SIGNATURE + "{ *(volatile int*)0 = 1; }",
    "abort": "#include <stdlib.h>\n" + SIGNATURE + "{ abort(); }",
    "hang": SIGNATURE + "{ volatile int spin = 1; while (spin) {} }",
    "noisy": "#include <stdio.h>\n" + SIGNATURE
    + '{ printf("{\\"ok\\": true}\\n"); fflush(stdout); for (int i = 0; i < n; i++) c[i] = a[i] + b[i]; }',
    "no_compile": SIGNATURE + "{ c[i] = 0; }",
}
LAUNCH = Launch("vadd", (Buffer("a", (N,), "float32"), Buffer("b", (N,), "float32"),
                         Buffer("c", (N,), "float32", kind="output"), Scalar("n", N)))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    results = build([Source(code) for code in KERNELS.values()], cache_dir=tmp_path_factory.mktemp("cache"))
    return dict(zip(KERNELS, results, strict=True))


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(N), rng.standard_normal(N)
    return Problem({"a": a, "b": b}, {"c": runner.quantize(a, "float32") + runner.quantize(b, "float32")})


@pytest.fixture(scope="module")
def worker():
    with Worker() as w:
        yield w


def trial(built, problem, name):
    return Trial(built[name], LAUNCH, problem)


def test_correct_kernel_passes_and_is_timed(built, problem, worker):
    [result] = run([trial(built, problem, "correct")], worker=worker, warmup=2, repeats=25)
    assert result.ok and result.error_kind is None
    assert result.repeats == 25 and 0 < result.min_s <= result.median_s < math.inf and result.iqr_s >= 0
    assert result.max_rel_err < 1e-6


def test_a_warmed_worker_runs_the_first_trial_and_one_never_used_is_killed_at_close(built, problem):
    with Worker() as w:
        w.warm()
        [result] = run([trial(built, problem, "correct")], worker=w, warmup=1, repeats=3)
        assert result.ok and w.starts == 1  # the trial used the process warm() started
        process = w._proc
    assert process.wait(timeout=30) == 0  # closed, it exited at the end of its input (reaped on a thread)
    deadline = time.monotonic() + 30
    while not process.stdout.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process.stdin.closed and process.stdout.closed  # its pipes too, not left to the garbage collector
    idle = Worker()
    idle.warm()
    process = idle._proc
    idle.close()  # it never became ready: killed, not waited for until the close timeout
    assert process is not None and process.returncode == -signal.SIGKILL


@pytest.mark.parametrize(
    ("name", "kind", "says"),
    [
        ("wrong", "wrong", "exceeds the tolerance 0.0001"),
        ("skips_last", "nan", "1 of 4096 elements are NaN"),  # the unwritten element keeps its poison
        ("segfault", "launch", "SIGSEGV"),
        ("abort", "launch", "SIGABRT"),
        ("no_compile", "compile", "undeclared"),
    ],
)
def test_failing_kernels_get_their_error_kind(built, problem, worker, name, kind, says):
    [result] = run([trial(built, problem, name)], worker=worker, timeout_s=10)
    assert not result.ok and result.error_kind == kind and says in result.error
    assert result.median_s == float("inf")


def test_a_worker_told_what_to_import_runs_its_trials(built, problem, monkeypatch):
    with Worker() as w:
        w.warm(load=("problems",))  # imported as the process starts
        assert run([trial(built, problem, "correct")], worker=w, warmup=1, repeats=3)[0].ok
        sent = []
        send = w._send
        monkeypatch.setattr(w, "_send", lambda message, **options: sent.append(message) or send(message, **options))
        w.warm(load=("problems", "torch"))  # a started worker keeps its process, told to load what is new to it
        w.warm(load=("torch",))
        assert sent == [{"load": ["torch"]}]
        assert run([trial(built, problem, "correct")], worker=w, warmup=1, repeats=3)[0].ok and w.starts == 1


def test_a_kernel_that_reads_scratch_it_never_wrote_fails_validation(problem, worker, tmp_path):
    # a plan hands kernels uninitialized scratch, so validation must not hand them zeros
    code = ("void vadd_t(const float* a, const float* b, float* c, float* t, int n) "
            "{ for (int i = 0; i < n; i++) c[i] = a[i] + b[i] + t[i]; }")
    launch = Launch("vadd_t", (*LAUNCH.args[:3], Buffer("t", (N,), "float32", kind="scratch"), Scalar("n", N)))
    [result] = run([Trial(build([Source(code)], cache_dir=tmp_path)[0], launch, problem)], worker=worker)
    assert not result.ok and result.error_kind == "nan"


def test_a_hanging_kernel_times_out_and_the_next_one_gets_a_fresh_worker(built, problem):
    with Worker() as w:
        results = run([trial(built, problem, n) for n in ("hang", "correct", "segfault", "correct")],
                      worker=w, timeout_s=1.0, repeats=5)
        assert [r.error_kind for r in results] == ["timeout", None, "launch", None]
        assert w.starts == 3  # first start, after the timeout, after the crash


def test_kernel_output_on_stdout_does_not_confuse_the_protocol(built, problem, worker):
    [result] = run([trial(built, problem, "noisy")], worker=worker, repeats=3)
    assert result.ok


def test_bad_launch_descriptions_are_launch_failures(built, problem, worker):
    wrong_shape = Launch("vadd", (Buffer("a", (N + 1,), "float32"), *LAUNCH.args[1:]))
    missing_symbol = Launch("nope", LAUNCH.args)
    results = run([Trial(built["correct"], wrong_shape, problem), Trial(built["correct"], missing_symbol, problem)],
                  worker=worker)
    assert [r.error_kind for r in results] == ["launch", "launch"]
    assert "has shape (4096,), the launch wants (4097,)" in results[0].error and "nope" in results[1].error


def test_a_failed_build_is_not_run():
    failed = BuildResult("cpu", error_kind="timeout", error="cc took too long")
    [result] = run([Trial(failed, LAUNCH, Problem({}, {}))])
    assert result.error_kind == "timeout" and result.error == "cc took too long"


HALF_SUM = """void rowsum(const {t}* x, {t}* y, int rows, int cols) {{
    for (int r = 0; r < rows; r++) {{
        float acc = 0.0f;
        for (int c = 0; c < cols; c++) acc += {load}(x[r * cols + c]);
        y[r] = {store}(acc{bias});
    }}
}}"""
BF16 = """#include <stdint.h>
#include <string.h>
static float load_bf16(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t store_bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4); return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
"""


@pytest.mark.parametrize(
    ("dtype", "ctype", "prelude", "load", "store"),
    [("float16", "_Float16", "", "(float)", "(_Float16)"),
     ("bfloat16", "uint16_t", BF16, "load_bf16", "store_bf16")],
)
def test_low_precision_outputs_use_their_dtype_tolerance(tmp_path, dtype, ctype, prelude, load, store):
    rows, cols = 64, 256
    x = np.random.default_rng(1).uniform(0.5, 1.5, (rows, cols))
    reference = {"y": runner.quantize(x, dtype).sum(axis=1)}
    launch = Launch("rowsum", (Buffer("x", (rows, cols), dtype), Buffer("y", (rows,), dtype, "output"),
                               Scalar("rows", rows), Scalar("cols", cols)))
    codes = [prelude + HALF_SUM.format(t=ctype, load=load, store=store, bias=bias) for bias in ("", " * 1.2f")]
    good, bad = build([Source(code) for code in codes], cache_dir=tmp_path)
    problem = Problem({"x": x}, reference)
    ok, wrong = run([Trial(good, launch, problem), Trial(bad, launch, problem)])
    assert ok.ok and 0 < ok.max_rel_err < {"float16": 1e-2, "bfloat16": 3e-2}[dtype], ok
    assert wrong.error_kind == "wrong" and 0.15 < wrong.max_rel_err < 0.25


def test_bfloat16_storage_rounds_like_torch():
    torch = pytest.importorskip("torch")
    values = np.random.default_rng(2).standard_normal(10_000).astype(np.float32) * 1e3
    ours = runner.to_storage(values, "bfloat16")
    rounded = torch.from_numpy(values).to(torch.bfloat16)
    np.testing.assert_array_equal(ours, rounded.view(torch.int16).numpy().view(np.uint16))
    np.testing.assert_array_equal(runner.quantize(values, "bfloat16"), rounded.double().numpy())


def test_poison_is_nan_for_floats_and_the_minimum_for_ints():
    assert np.isnan(runner.poisoned((3,), "float16")).all() and np.isnan(runner.quantize(np.nan, "bfloat16"))
    assert np.isnan(runner.to_float(runner.poisoned((2,), "bfloat16"), "bfloat16")).all()
    assert (runner.poisoned((2,), "int32") == np.iinfo(np.int32).min).all()


def test_launch_round_trips_through_json():
    launch = Launch("k", (*LAUNCH.args, Scalar("eps", 1e-5, "float32")), grid=(8, 1, 1), block=(256, 1, 1),
                    shared_bytes=1024)
    assert Launch.from_json(launch.to_json()) == launch


def test_contract_rejects_bad_descriptions():
    with pytest.raises(ValueError, match="unknown buffer dtype"):
        Buffer("x", (1,), "float8")
    with pytest.raises(ValueError, match="repeats an argument name"):
        Launch("k", (Scalar("n", 1), Scalar("n", 2)))
    with pytest.raises(ValueError, match="C identifier"):
        Buffer("x-y", (1,), "float32")



CUDA_VADD = """extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] BODY;
}"""


@needs_gpu
def test_cuda_kernels_are_validated_timed_and_isolated(tmp_path, problem):
    variants = {"correct": "+ b[i]", "wrong": "- b[i]", "crash": "+ b[i]; if (i == 0) ((float*)0)[1 << 20] = 1.0f"}
    built = build([Source(CUDA_VADD.replace("BODY", body), backend="cuda") for body in variants.values()],
                  cache_dir=tmp_path)
    assert all(b.ok for b in built), [b.error for b in built]
    launch = Launch("vadd", LAUNCH.args, grid=((N + 255) // 256, 1, 1), block=(256, 1, 1))
    correct, wrong, crash = (Trial(b, launch, problem) for b in built)
    too_wide = Trial(built[0], replace(launch, grid=(1, 1, 1), block=(4096, 1, 1)), problem)  # over 1024 threads
    with Worker() as w:
        results = run([correct, wrong, too_wide, correct, crash, correct], worker=w, repeats=20)
        assert [r.error_kind for r in results] == [None, "wrong", "launch", None, "launch", None], \
            [r.error for r in results]
        # a refused launch leaves the context usable and the worker goes on; the illegal address ends it, and the
        # next trial gets a fresh one
        assert w.starts == 2
    assert results[0].repeats == 20 and 0 < results[0].min_s <= results[0].median_s < 1e-3
    assert results[0].max_rel_err < 1e-6


CUDA_SLOW_VADD = """extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    long long start = clock64();
    while (clock64() - start < SPIN) {}
    if (i < n) c[i] = a[i] + b[i];
}"""


@needs_gpu
def test_a_cuda_kernel_far_slower_than_the_incumbent_runs_once_in_all(tmp_path, problem):
    # about 0.3 s a call at the H100's and H200's 1.98 GHz: a second call would take the trial past 0.6 s
    [slow] = build([Source(CUDA_SLOW_VADD.replace("SPIN", str(600_000_000)), backend="cuda")], cache_dir=tmp_path)
    launch = Launch("vadd", LAUNCH.args, grid=((N + 255) // 256, 1, 1), block=(256, 1, 1))
    with Worker() as w:
        [warm] = run([Trial(slow, launch, problem)], worker=w, repeats=3, best_s=1e-3)  # the problem uploaded
        started = time.perf_counter()
        [result] = run([Trial(slow, launch, problem)], worker=w, repeats=3, best_s=1e-3)
        elapsed = time.perf_counter() - started
    assert warm.ok and result.ok and result.repeats == 1 and result.median_s > 0.2, result
    assert elapsed < 1.5 * result.median_s, (elapsed, result.median_s)


CLOBBER = SIGNATURE + "{ for (int i = 0; i < n; i++) { c[i] = a[i] + b[i]; ((float*)a)[i] = 0; } }"
CUDA_CLOBBER = """extern "C" __global__ void vadd(float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { c[i] = a[i] + b[i]; a[i] = 0; }
}"""


def test_a_kernel_that_writes_its_input_spoils_no_later_trial(built, problem, tmp_path):
    [clobber] = build([Source(CLOBBER)], cache_dir=tmp_path)
    stored = Problem({k: runner.to_storage(v, "float32") for k, v in problem.inputs.items()}, problem.reference)
    with Worker() as w:
        first, second = run([Trial(clobber, LAUNCH, stored), trial(built, stored, "correct")], worker=w, repeats=3)
    assert first.ok and second.ok, (first.error, second.error)  # the first's timed calls read zeros, not the check


@needs_gpu
def test_cuda_trials_get_fresh_device_inputs_and_float32_references(tmp_path, problem):
    built = build([Source(CUDA_CLOBBER, backend="cuda"), Source(CUDA_VADD.replace("BODY", "+ b[i]"), backend="cuda")],
                  cache_dir=tmp_path)
    launch = Launch("vadd", LAUNCH.args, grid=((N + 255) // 256, 1, 1), block=(256, 1, 1))
    compact = Problem(problem.inputs, {"c": np.asarray(problem.reference["c"], np.float32)}, {"c": 1e-4})
    with Worker() as w:
        results = run([Trial(b, launch, p) for p in (problem, compact) for b in built], worker=w, repeats=3)
    assert all(r.ok for r in results), [r.error for r in results]
    assert all(r.max_rel_err < 1e-6 for r in results)


def test_a_float32_reference_is_saved_as_float32_and_other_references_as_float64(tmp_path):
    path = tmp_path / "p.npz"
    Problem({"x": np.ones(2, np.float16)}, {"y": np.ones(2, np.float32), "z": np.ones(2, np.int64)}).save(path)
    with np.load(path) as saved:
        assert saved["in.x"].dtype == np.float16
        assert saved["ref.y"].dtype == np.float32 and saved["ref.z"].dtype == np.float64


SLOW = SIGNATURE + "{ volatile long spin = 0; for (long r = 0; r < 20000000; r++) spin += r;" \
    " for (int i = 0; i < n; i++) c[i] = a[i] + b[i]; }"


def test_a_candidate_far_slower_than_the_incumbent_is_timed_by_one_call(built, problem, worker, tmp_path):
    [slow] = build([Source(SLOW)], cache_dir=tmp_path)
    fast, far = run([trial(built, problem, "correct"), Trial(slow, LAUNCH, problem)], worker=worker, repeats=5)
    assert fast.ok and fast.repeats == 5 and far.ok and far.repeats == 1 and far.median_s > runner.SLOWER_FLOOR_S
    [alone] = run([Trial(slow, LAUNCH, problem)], worker=worker, repeats=5)  # no incumbent: timed as usual
    assert alone.ok and alone.repeats > 1
    [known] = run([Trial(slow, LAUNCH, problem)], worker=worker, repeats=5, best_s=fast.median_s)
    assert known.ok and known.repeats == 1


def test_a_problem_is_saved_once_across_runs_and_survives_a_worker_restart(built, problem):
    with Worker() as w:
        first = run([trial(built, problem, "correct")], worker=w, repeats=3)
        hang, again = run([trial(built, problem, "hang"), trial(built, problem, "correct")], worker=w, timeout_s=1.0,
                          repeats=3)
        assert first[0].ok and hang.error_kind == "timeout" and again.ok, again.error
        assert w.saves == 1 and w.starts == 2
        others = [Problem(problem.inputs, problem.reference) for _ in range(runner.KEPT_PROBLEMS + 1)]
        paths = [Path(w.problem_file(p)) for p in others]
        assert w.saves == 1 + len(others) and not paths[0].exists() and all(p.exists() for p in paths[1:])
    assert not any(p.exists() for p in paths)


class SpecWorker(Worker):
    """Sends a problem that has a spec as its spec on every backend (``run`` does so for cuda trials only)."""

    def spec_source(self, problem, backend):
        return super().spec_source(problem, "cuda")


def test_cuda_trials_send_a_described_problems_spec_and_cpu_trials_its_saved_arrays(monkeypatch):
    task = make_task(single("add", [("a", (8, 5), "float32"), ("b", (8, 5), "float32")], (8, 5)))
    [kernel] = kernels(task.program, [default_recipe(task.program, "cpu")], "cpu")
    arrays = Problem(task.problem.inputs, task.problem.reference)
    sent = []
    with Worker() as w:
        monkeypatch.setattr(w, "request", lambda message, timeout_s: sent.append(message) or RunResult.failure(
            "launch", "not run"))
        run([Trial(BuildResult(backend, artifact="k"), kernel.launches, p)
             for backend, p in (("cuda", task.problem), ("cpu", task.problem), ("cuda", arrays))], worker=w)
        assert w.saves == 2
    assert sent[0]["problem"] == {"spec": task.problem.spec} == json.loads(json.dumps(sent[0]["problem"]))
    assert isinstance(sent[1]["problem"], str) and isinstance(sent[2]["problem"], str)
    assert sent[0]["tolerance"] == sent[1]["tolerance"] == {"b2": 1e-4}


def _task_and_kernels(backend, graphs):
    """The task of the first graph and the default-recipe kernels of all."""
    return make_task(graphs[0]), [kernels(lower(g), [default_recipe(lower(g), backend)], backend)[0] for g in graphs]


def _binary(op, shape=(64, 33)):
    return single(op, [("a", shape, "float32"), ("b", shape, "float32")], shape)


def test_a_worker_builds_a_problem_sent_as_its_spec_and_validates_against_it(tmp_path):
    task, made = _task_and_kernels("cpu", [_binary("add"), _binary("sub")])
    built = build([Source(k.code) for k in made], cache_dir=tmp_path)
    with SpecWorker() as w:
        right, wrong = run([Trial(b, k.launches, task.problem) for b, k in zip(built, made, strict=True)], worker=w,
                           repeats=2)
        assert w.saves == 0 and w.starts == 1
    assert right.ok and right.max_rel_err < 1e-6 and wrong.error_kind == "wrong"


def test_a_problem_the_worker_cannot_load_fails_its_trial_only(built, problem):
    unreadable = Problem.described({"seed": 0}, {}, lambda: problem)
    with SpecWorker() as w:
        bad, good = run([Trial(built["correct"], LAUNCH, unreadable), trial(built, problem, "correct")], worker=w,
                        repeats=2)
        assert w.starts == 1
    assert bad.error_kind == "launch" and "cannot load the problem: ValueError: a problem spec is" in bad.error
    assert good.ok


def test_a_worker_builds_prepared_problems_while_it_waits_and_trials_find_them_built(tmp_path):
    graphs = [_binary(op) for op in ("add", "sub", "mul")]
    tasks = [make_task(g) for g in graphs]
    made = [kernels(t.program, [default_recipe(t.program, "cpu")], "cpu")[0] for t in tasks]
    built = build([Source(k.code) for k in made], cache_dir=tmp_path)
    unreadable = Problem.described({"seed": 0}, {}, lambda: tasks[0].problem)
    with SpecWorker() as w:
        w.prepare([t.problem for t in tasks] + [unreadable], "cpu")
        time.sleep(4)  # the worker starts and builds while nothing is asked of it
        results = run([Trial(b, k.launches, t.problem) for b, k, t in zip(built, made, tasks, strict=True)]
                      + [Trial(built[0], made[0].launches, unreadable)], worker=w, repeats=2)
        assert w.settle() == 3 and w.starts == 1  # every trial found its problem built ahead
    assert all(r.ok and r.max_rel_err < 1e-6 for r in results[:3]), results
    assert results[3].error_kind == "launch" and "cannot load the problem: ValueError" in results[3].error


def test_settling_drops_the_prepared_problems_and_starts_no_worker(tmp_path):
    tasks = [make_task(_binary(op)) for op in ("add", "sub")]
    made = [kernels(t.program, [default_recipe(t.program, "cpu")], "cpu")[0] for t in tasks]
    built = build([Source(k.code) for k in made], cache_dir=tmp_path)
    idle = SpecWorker()
    assert idle.settle() == 0 and idle.starts == 0
    with SpecWorker() as w:
        w.prepare([t.problem for t in tasks], "cpu")
        time.sleep(4)
        assert w.settle() == 0
        results = run([Trial(b, k.launches, t.problem) for b, k, t in zip(built, made, tasks, strict=True)], worker=w,
                      repeats=2)
        assert all(r.ok for r in results) and w.settle() == 0  # dropped, even if built: built again when asked


def _rowwise(op, dtype):
    return single(op, [("x", (256, 1000), dtype)], (256, 1000), dtype, axis=1)


@needs_gpu
@pytest.mark.parametrize("graphs", [
    lambda: [_binary("add", (256, 1000)), _binary("sub", (256, 1000))],
    lambda: [_rowwise("softmax", "bfloat16"), _rowwise("log_softmax", "bfloat16")],
    lambda: [_rowwise("softmax", "float16"), _rowwise("log_softmax", "float16")],
], ids=["add-float32", "softmax-bfloat16", "softmax-float16"])
def test_cuda_kernels_are_validated_against_a_problem_built_on_the_gpu(tmp_path, graphs):
    task, made = _task_and_kernels("cuda", graphs())
    built = build([Source(k.code, "cuda", arch=cuda.device_arch()) for k in made], cache_dir=tmp_path)
    with Worker() as w:
        right, wrong = run([Trial(b, k.launches, task.problem) for b, k in zip(built, made, strict=True)], worker=w,
                           repeats=3)
        assert w.saves == 0  # the problem went as its spec: nothing was saved on the host
    [tolerance] = task.problem.tolerances(made[0].launches).values()
    assert right.ok and right.max_rel_err < tolerance, right.error
    assert wrong.error_kind == "wrong", wrong


ENVIRONMENT_PROBE = """#include <stdlib.h>
#include <string.h>
void cupy_env(float* accelerators_empty, float* pch, int n) {
    const char* a = getenv("CUPY_ACCELERATORS");
    const char* p = getenv("CUPY_NVRTC_USE_PCH");
    accelerators_empty[0] = (a != NULL && a[0] == 0) ? 1.0f : 0.0f;
    pch[0] = (p != NULL && strcmp(p, "1") == 0) ? 1.0f : 0.0f;
}"""


def test_the_worker_process_compiles_cupys_kernels_without_cub_and_with_precompiled_headers(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_ACCELERATORS", "cub")  # a user's own setting does not reach the worker
    monkeypatch.delenv("CUPY_NVRTC_USE_PCH", raising=False)
    [artifact] = build([Source(ENVIRONMENT_PROBE)], cache_dir=tmp_path)
    launch = Launch("cupy_env", (Buffer("accelerators_empty", (1,), "float32", kind="output"),
                                 Buffer("pch", (1,), "float32", kind="output"), Scalar("n", 1)))
    problem = Problem({}, {"accelerators_empty": np.ones(1), "pch": np.ones(1)})
    with Worker() as w:
        [result] = run([Trial(artifact, launch, problem)], worker=w, warmup=0, repeats=3)
    assert result.ok, result.error


def _recording_python(tmp_path: Path) -> tuple[str, Path]:
    """A python executable that appends its arguments to a file, one line a process, then runs the real one."""
    import sys

    log = tmp_path / "launches"
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {sys.executable} "$@"\n')
    script.chmod(0o755)
    return str(script), log


def _launches(log: Path, at_least: int = 0) -> list[str]:
    """The launches recorded, once at least ``at_least`` are (a process records itself after it was started)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(lines := log.read_text().splitlines() if log.exists() else []) < at_least:
        time.sleep(0.02)
    return lines


def test_a_worker_that_loads_cuda_starts_a_spare_without_a_context_that_the_next_worker_adopts(built, problem,
                                                                                                 tmp_path):
    python, log = _recording_python(tmp_path)
    try:
        with Worker(python=python) as first:
            first.warm(["cuda"])  # on a machine without CuPy the load fails quietly: the trial says what is wrong
            # the spare starts with the worker, so it has the whole optimize to import torch
            assert _launches(log, 2) == ["-m transforms.worker cuda", "-m transforms.worker cupy problems torch"]
            assert run([trial(built, problem, "correct")], worker=first, warmup=1, repeats=3)[0].ok
        spare = runner._spare._held[1][0]
        with Worker(python=python) as second:
            second.warm(["cuda", "problems"])  # adopts the spare and tells it to make its context
            [result] = run([trial(built, problem, "correct")], worker=second, warmup=1, repeats=3)
            assert result.ok and second._proc is spare  # no process of its own
        assert _launches(log, 3)[2:] == ["-m transforms.worker cupy problems torch"]  # the next spare
        with Worker(python=python) as on_cpu:  # a cpu worker (not told to load cuda) starts its own process
            assert run([trial(built, problem, "correct")], worker=on_cpu, warmup=1, repeats=3)[0].ok
        assert _launches(log, 4)[3:] == ["-m transforms.worker"]
        runner._spare.discard()
        with Worker(python=python) as on_cpu:
            assert run([trial(built, problem, "correct")], worker=on_cpu, warmup=1, repeats=3)[0].ok
        assert runner._spare.take(python) is None  # and leaves no spare
    finally:
        runner._spare.discard()


def test_a_spare_started_in_another_environment_is_not_adopted_but_dropped(built, problem, monkeypatch):
    try:
        with Worker() as first:
            first.warm(["cuda"])
        spare = runner._spare._held[1][0]
        assert spare.args[-3:] == ["cupy", "problems", "torch"]
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the next optimize is meant for another GPU
        with Worker() as second:
            second.warm(["cuda"])
            assert run([trial(built, problem, "correct")], worker=second, warmup=1, repeats=3)[0].ok
            assert second._proc is not spare and second._proc.args[-1] == "cuda"  # a process of its own
            assert spare.poll() is not None  # the stale spare killed
    finally:
        runner._spare.discard()


def test_the_spare_worker_is_killed_when_its_process_exits(tmp_path):
    import subprocess
    import sys

    python, log = _recording_python(tmp_path)
    script = ("from transforms.run import Worker, _spare\n"
              f"w = Worker(python={python!r}); w.warm(['cuda']); w.close()\n"
              "process, _, replies, _ = _spare._held[1]; replies.next(30)\n"  # ready: it imports torch now
              "print(process.pid)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=Path(runner.__file__).resolve().parents[1], check=True)
    pid = int(out.stdout.split()[-1])
    # killed and reaped as its process exited (alive, it would import torch for seconds yet)
    assert not Path(f"/proc/{pid}").exists()


def _gpu_processes() -> set[int]:
    """The pids with a CUDA context on the GPUs (nvidia-smi)."""
    import subprocess

    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return {int(line) for line in out.split()}


@needs_gpu
def test_the_spare_holds_no_cuda_context_until_a_cuda_worker_adopts_it_and_runs_its_trials(tmp_path, problem):
    built = build([Source(CUDA_VADD.replace("BODY", "+ b[i]"), backend="cuda")], cache_dir=tmp_path)
    launch = Launch("vadd", LAUNCH.args, grid=((N + 255) // 256, 1, 1), block=(256, 1, 1))
    try:
        with Worker() as first:
            first.warm(["cuda"])
            assert run([Trial(built[0], launch, problem)], worker=first, repeats=3)[0].ok
        process = runner._spare._held[1][0]
        time.sleep(10)  # its imports (torch's the longest, 1.5-2.5 s) have ended
        assert process.poll() is None and process.pid not in _gpu_processes()
        with Worker() as second:
            second.warm(["cuda", "problems"])
            [result] = run([Trial(built[0], launch, problem)], worker=second, repeats=3)
            assert second._proc is process and result.ok, result.error
            assert process.pid in _gpu_processes()
    finally:
        runner._spare.discard()
