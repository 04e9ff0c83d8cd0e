import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.gpu import needs_gpu
from transforms import worker
from transforms.results import RunResult
from transforms.run import Buffer, Launch, Scalar
from transforms.worker import check, copies_past_l2, host_arrays

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {"numpy", "cupy", "cupy_backends", "fastrlock", "cuda", "torch", "transforms"}

PROBE = """
import json, sys
before = set(sys.modules)
import transforms.worker, transforms.run, transforms.build, transforms.results
import transforms.compilers.cpu, transforms.compilers.cuda
print(json.dumps(sorted({name.split(".")[0] for name in set(sys.modules) - before})))
"""


def test_the_measurement_path_imports_only_numpy_cupy_and_the_standard_library():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True)
    imported = set(json.loads(out.stdout))
    third_party = {name for name in imported if name not in sys.stdlib_module_names and not name.startswith("_")}
    assert "numpy" in third_party and "transforms" in third_party
    assert third_party <= ALLOWED, third_party - ALLOWED
    assert not {"embed", "pydantic", "sqlalchemy", "faiss"} & imported


def test_check_accepts_within_tolerance_and_reports_the_error():
    reference = np.array([1.0, -2.0, 4.0])
    kind, error, _ = check(reference * (1 + 5e-5), reference, 1e-4)
    assert kind is None and error == pytest.approx(5e-5)
    kind, error, message = check(reference * (1 + 5e-4), reference, 1e-4)
    assert kind == "wrong" and error == pytest.approx(5e-4) and "exceeds the tolerance" in message


def test_nan_never_passes_not_even_against_a_nan_reference():
    reference = np.array([1.0, np.nan, 3.0])
    assert check(np.array([1.0, np.nan, 3.0]), reference, 1.0)[0] == "nan"
    assert check(np.array([1.0, 2.0, np.inf]), np.array([1.0, 2.0, 3.0]), 1.0)[0] == "nan"
    assert check(np.array([1.0, 5.0, 3.0]), reference, 1.0)[0] == "wrong"  # finite where the reference is not
    assert check(np.array([np.inf, 2.0]), np.array([np.inf, 2.0]), 1e-9)[0] is None  # matching infinities


def test_tiny_reference_values_are_measured_against_the_output_scale():
    reference = np.array([1000.0, 1e-9])
    kind, error, _ = check(np.array([1000.0, 1e-6]), reference, 1e-4)
    assert kind is None and error == pytest.approx(1e-6, rel=1e-2)  # |1e-6 - 1e-9| / (1e-3 * 1000)


def test_shape_mismatch_is_wrong():
    assert check(np.zeros(3), np.zeros(4), 1.0)[0] == "wrong"


def test_host_arrays_convert_and_poison_outputs_and_scratch():
    launch = Launch("k", (Buffer("x", (2,), "float16"), Buffer("y", (2,), "float32", "output"),
                          Buffer("tmp", (3,), "int32", "scratch"), Scalar("n", 2)))
    arrays = host_arrays([launch], {"x": np.array([1.0, 2.0])})
    assert arrays["x"].dtype == np.float16 and arrays["x"].tolist() == [1.0, 2.0]
    assert np.isnan(arrays["y"]).all() and arrays["tmp"].tolist() == [np.iinfo(np.int32).min] * 3
    with pytest.raises(ValueError, match="no input for buffer 'x'"):
        host_arrays([launch], {})


def test_host_arrays_cover_every_launch_of_a_sequence_and_reject_conflicts():
    x, y = Buffer("x", (2,), "float32"), Buffer("y", (2,), "float32", "output")
    t = Buffer("t", (2,), "float32", "scratch")
    arrays = host_arrays([Launch("a", (x, t)), Launch("b", (t, y))], {"x": np.array([1.0, 2.0])})
    assert sorted(arrays) == ["t", "x", "y"] and np.isnan(arrays["y"]).all() and np.isnan(arrays["t"]).all()
    with pytest.raises(ValueError, match="described differently"):
        host_arrays([Launch("a", (x,)), Launch("b", (Buffer("x", (3,), "float32"),))], {"x": np.zeros(2)})


def test_buffer_copies_exceed_twice_the_l2_cache():
    assert copies_past_l2(1 << 20, 50 << 20) == 64  # capped
    assert copies_past_l2(10 << 20, 50 << 20) == 11  # 11 x 10 MB > 100 MB
    assert copies_past_l2(1 << 30, 50 << 20) == 2  # already past L2: two copies, so replays alternate buffers
    assert copies_past_l2(4 << 30, 60 << 20) == 2


def test_timing_stops_early_for_a_slow_candidate_but_keeps_a_minimum(monkeypatch):
    clock = [0.0]  # a fake clock: each call "takes" the seconds it is told to, whatever the machine's load
    monkeypatch.setattr(worker, "time", SimpleNamespace(perf_counter=lambda: clock[0],
                                                       perf_counter_ns=lambda: int(clock[0] * 1e9)))

    def takes(seconds: float):
        return lambda: clock.__setitem__(0, clock[0] + seconds)

    slow = worker.CpuBackend().time(takes(0.3), warmup=0, repeats=50, call_s=0.3)
    fast = worker.CpuBackend().time(takes(1e-5), warmup=0, repeats=50, call_s=1e-5)
    assert slow == pytest.approx([0.3] * 4)  # the 4th call starts at 0.9 s, within the 1 s budget; the 5th does not
    assert fast == pytest.approx([1e-5] * 50)


def test_a_long_call_is_timed_without_warm_up():
    calls = []
    worker.CpuBackend().time(lambda: calls.append(1), warmup=5, repeats=3, call_s=worker.LONG_CALL_S)
    assert len(calls) == 3
    worker.CpuBackend().time(lambda: calls.append(1), warmup=5, repeats=3, call_s=0.0)
    assert len(calls) == 3 + 8


SCALE_KERNEL = "void k(const float* a, float* out) { for (int i = 0; i < 256; i++) out[i] = a[i] * %sf; }"


@pytest.mark.parametrize("factor,raised,ok", [("1.0f", None, True), ("1.0005f", 1e-3, True),
                                              ("1.0005f", 2e-4, False)])
def test_a_raised_tolerance_is_computed_only_for_a_candidate_that_fails_the_dtypes(tmp_path, factor, raised, ok):
    from transforms.build import Source, build

    [built] = build([Source(SCALE_KERNEL % factor.removesuffix("f"))], cache_dir=tmp_path)
    a = np.random.default_rng(0).uniform(1, 2, 256).astype(np.float32)
    asked = []

    def raise_tolerances():
        asked.append(1)
        return {"out": raised}, {}

    problem = worker.LoadedProblem("p", {"a": a}, {"out": a.astype(np.float64)}, raise_tolerances=raise_tolerances)
    launch = Launch("k", (Buffer("a", (256,), "float32"), Buffer("out", (256,), "float32", "output")))
    message = {"backend": "cpu", "artifact": built.artifact, "launches": [launch.to_json()],
               "tolerance": {"out": 1e-4}, "warmup": 0, "repeats": 3}
    result, _ = worker.execute(message, problem)
    assert result.ok == ok
    assert len(asked) == (0 if raised is None else 1)  # an exact kernel never pays for the raised tolerances
    if not ok:
        assert result.error_kind == "wrong" and "tolerance 0.0002" in result.error  # the raised one, still over


def test_problems_are_built_ahead_in_order_a_few_at_a_time_and_a_failed_one_is_left_to_its_trial(monkeypatch):
    opened = []

    def open_problem(source, xp):
        opened.append(source)
        if source == "bad":
            raise ValueError("no such problem")
        yield
        return worker.LoadedProblem(source, {}, {})

    monkeypatch.setattr(worker.LoadedProblem, "open_steps", staticmethod(open_problem))
    problems = worker.Problems()
    sources = ["bad", *(f"p{i}" for i in range(worker.AHEAD + 1))]
    problems.prepare(sources, "cpu")
    while problems.pending():
        problems.build_next()
    assert opened == sources[:worker.AHEAD + 1]  # at most AHEAD held; the failed one holds no place
    assert problems.get("p0", "cpu").source == "p0" and problems.ahead == 1 and len(opened) == worker.AHEAD + 1
    assert problems.pending()  # p0 is taken: room to build the last one
    problems.build_next()
    assert opened[-1] == f"p{worker.AHEAD}"
    with pytest.raises(ValueError, match="no such problem"):
        problems.get("bad", "cpu")  # built again when asked, and its failure is the trial's
    problems.prepare(["p1"], "cpu")
    assert not problems.pending() and problems.get("p1", "cpu").source == "p1" and problems.ahead == 2


class ScriptedLines:
    """Messages as a worker's stdin would give them: each step is a message, or None for a moment with none."""

    def __init__(self, steps, events):
        self.steps, self.events, self.closed = list(steps), events, False

    def next(self, timeout_s):
        while self.steps:
            step = self.steps.pop(0)
            if step is not None or timeout_s is not None:
                return step
        self.closed = True
        return None


def built_in_one_step(source, events):
    events.append(f"build {source}")
    return worker.LoadedProblem(source, {}, {})
    yield  # a generator: LoadedProblem.open_steps


def built_in_steps(source, events, steps=3):
    for step in range(steps):
        events.append(f"{source} step {step}")
        yield
    return worker.LoadedProblem(source, {}, {})


def test_a_trial_that_arrives_while_a_problem_is_built_ahead_waits_for_one_step_of_it(monkeypatch):
    events = []
    monkeypatch.setattr(worker.LoadedProblem, "open_steps", staticmethod(lambda source, xp: built_in_steps(
        source, events)))
    monkeypatch.setattr(worker, "execute", lambda message, problem: (events.append(
        f"trial on {problem.source}") or (RunResult(ok=True, median_s=1e-5), False)))
    lines = ScriptedLines([{"prepare": ["p0", "p1"], "backend": "cpu"}, None, {"problem": "px", "backend": "cpu"},
                           *[None] * 4, {"problem": "p1", "backend": "cpu"}, {"problem": "p0", "backend": "cpu"},
                           *[None] * 4], events)
    worker.serve(lines, lambda data: events.append(data))
    trials = [e for e in events if isinstance(e, dict) and "ok" in e]
    events = [e for e in events if not isinstance(e, dict)]
    assert events == ["p0 step 0",  # a step of p0, then the trial that came meanwhile, on a problem built now
                      "px step 0", "px step 1", "px step 2", "trial on px",
                      "p0 step 1", "p0 step 2",  # p0 built further (its end, one step more, shows nothing)
                      "p1 step 0",  # p1 begun
                      "p1 step 1", "p1 step 2", "trial on p1",  # the rest of p1's build (not all of it), for its trial
                      "trial on p0"]  # built ahead
    assert len(trials) == 3 and all(t["ok"] for t in trials)


def test_the_worker_builds_prepared_problems_then_warms_each_library_once_and_settling_stops_both(monkeypatch):
    events = []
    monkeypatch.setattr(worker.LoadedProblem, "open_steps", staticmethod(lambda source, xp: built_in_one_step(
        source, events)))
    monkeypatch.setattr(worker, "WARM", {"lib": lambda: events.append("warm lib"),
                                         "broken": lambda: 1 / 0})
    prepare = {"prepare": ["p0", "p1"], "backend": "cpu", "warm": ["broken", "lib", "unknown"]}
    idle = [None] * 6
    lines = ScriptedLines([prepare, *idle, prepare, *idle, {"prepare": ["p2"], "backend": "cpu", "warm": ["lib"]},
                           {"prepare": [], "backend": "cpu"}, *idle], events)
    worker.serve(lines, lambda data: events.append(data))
    assert events == [{"ahead": 0}, "build p0", "build p1", "warm lib",  # the broken one failed quietly
                      {"ahead": 0},  # p0 and p1 still built; each library warmed once
                      {"ahead": 0}, {"ahead": 0}]  # settled before p2 was built


AS_MAIN = """
import atexit, runpy, sys
atexit.register(lambda: sys.stderr.write(f"loaded {'transforms.problem' in sys.modules}"))
sys.argv = ["transforms.worker", *sys.argv[1:]]
runpy.run_module("transforms.worker", run_name="__main__")
"""


@pytest.mark.parametrize("names", [["problems"], []])
def test_a_worker_process_imports_what_its_arguments_name(names: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", AS_MAIN, *names], cwd=Path(__file__).resolve().parents[2],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout.splitlines()[0]) == {"ready": True}
    assert done.stderr.endswith(f"loaded {bool(names)}")  # served until stdin closed, having imported it first


def test_a_worker_loads_what_it_is_started_with(monkeypatch):
    events = []
    monkeypatch.setattr(worker, "importlib",
                        SimpleNamespace(import_module=lambda name: events.append(f"import {name}")))
    monkeypatch.setitem(worker.LOADS, "lib", lambda: events.append("load lib"))
    worker._load(["problems", "lib", "unknown"])
    assert events == ["import transforms.problem", "load lib"]  # an unknown name loads nothing


def test_a_worker_records_the_loads_that_succeeded(monkeypatch):
    monkeypatch.setattr(worker, "LOADED", set())
    monkeypatch.setitem(worker.LOADS, "lib", lambda: None)
    monkeypatch.setitem(worker.LOADS, "broken", lambda: 1 / 0)
    worker._load(["broken", "lib"])
    assert sorted(worker.LOADED) == ["lib"]


@pytest.mark.parametrize("loaded", [{"torch"}, set()])
def test_a_worker_that_has_loaded_torch_builds_its_problems_with_torch_references(loaded, monkeypatch):
    from embed.builder import GraphBuilder
    from embed.lower import lower
    from transforms import problem as problem_module

    b = GraphBuilder("s")
    x = b.input("x", (8, 16), "float32")
    graph = b.build([b.node("softmax", [x], (8, 16), "float32", name="out", axis=-1)])
    spec = problem_module.described_problem(graph, lower(graph), seed=1).spec
    evaluated = []
    evaluate_steps = problem_module.evaluate_steps
    monkeypatch.setattr(problem_module, "evaluate_steps",
                        lambda *a, **k: evaluated.append(1) or evaluate_steps(*a, **k))
    monkeypatch.setattr(worker, "LOADED", loaded)
    problem = worker.LoadedProblem.open({"spec": spec})
    assert [r.shape for r in problem.reference.values()] == [(8, 16)]
    assert bool(evaluated) == ("torch" not in loaded)  # PyTorch's reference once torch is in, else the evaluator's


def test_a_load_message_loads_on_a_thread_while_the_worker_answers_and_torch_trials_wait_for_it(monkeypatch):
    events, release = [], threading.Event()

    def load_slowly():
        release.wait(5)
        events.append("loaded lib")

    monkeypatch.setitem(worker.LOADS, "lib", load_slowly)
    monkeypatch.setattr(worker.LoadedProblem, "open_steps", staticmethod(lambda source, xp: built_in_one_step(
        source, events)))
    monkeypatch.setattr(worker, "execute", lambda message, problem: (events.append("trial") or (
        RunResult(ok=True, median_s=1e-5), False)))
    generated = {"problem": "p0", "backend": "cpu", "launches": [{"entry": "k", "library": ""}]}
    cudnn = {"problem": "p0", "backend": "cpu", "launches": [{"entry": "c", "library": "cudnn_conv"}]}

    def reply(data):
        events.append(data.get("ok", data))
        if data.get("ok"):
            release.set()  # the load ends once a trial has run beside it

    worker.serve(ScriptedLines([{"load": ["lib", "unknown"]}, generated, cudnn], events), reply)
    assert events == [{"ahead": 0}, "build p0", "trial", True, "loaded lib", "trial", True]


class ScriptedLoading:
    """Imports that end at the ``ends_at``-th look; a trial waits for them (``join``)."""

    def __init__(self, ends_at, events):
        self.looks, self.ends_at, self.events = 0, ends_at, events

    def is_alive(self):
        self.looks += 1
        self.events.append("loaded?")
        return self.looks < self.ends_at

    def join(self):
        self.events.append("wait for the imports")


def test_the_worker_builds_and_runs_trials_while_its_imports_run_but_torch_trials_and_warm_ups_wait(monkeypatch):
    events = []
    monkeypatch.setattr(worker.LoadedProblem, "open_steps", staticmethod(lambda source, xp: built_in_one_step(
        source, events)))
    monkeypatch.setattr(worker, "WARM", {"lib": lambda: events.append("warm lib")})
    monkeypatch.setattr(worker, "execute", lambda message, problem: (events.append("trial") or (
        RunResult(ok=True, median_s=1e-5), False)))
    generated = {"problem": "p0", "backend": "cpu", "launches": [{"entry": "k", "library": ""}]}
    cudnn = {"problem": "p0", "backend": "cpu", "launches": [{"entry": "c", "library": "cudnn_conv"},
                                                             {"entry": "epilogue", "library": ""}]}
    steps = [{"prepare": ["p0"], "backend": "cpu", "warm": ["lib"]}, None, generated, cudnn, *[None] * 6]
    worker.serve(ScriptedLines(steps, events), lambda data: events.append(data.get("ok", data)),
                 loads=worker.Loads(ScriptedLoading(4, events)))
    assert events[:10] == [{"ahead": 0}, "loaded?", "build p0",  # built while the imports ran
                           "loaded?", "trial", True,  # a generated kernel's trial, timed behind the gate
                           "loaded?", "wait for the imports", "trial", True]  # cuDNN's, run through torch
    assert events[10:] == ["loaded?", "warm lib"]  # warmed only once they ended


SLOW_IMPORT = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import transforms.worker as worker
worker.LOADS["slow"] = lambda: __import__("slow_module")
sys.argv = ["transforms.worker", "slow"]
started = time.perf_counter()
worker.main()
sys.stderr.write(json.dumps({"loaded": "slow_module" in sys.modules, "s": time.perf_counter() - started}))
"""


def test_a_worker_process_answers_while_it_imports_what_it_was_started_with(tmp_path: Path) -> None:
    (tmp_path / "slow_module.py").write_text("import time\ntime.sleep(3)\n")
    worker_process = subprocess.Popen([sys.executable, "-c", SLOW_IMPORT, str(tmp_path)],
                                      cwd=Path(__file__).resolve().parents[2], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert json.loads(worker_process.stdout.readline()) == {"ready": True}
    started = time.perf_counter()
    worker_process.stdin.write(json.dumps({"prepare": [], "backend": "cpu"}) + "\n")
    worker_process.stdin.flush()
    assert json.loads(worker_process.stdout.readline()) == {"ahead": 0}
    answered_s = time.perf_counter() - started
    worker_process.stdin.close()
    assert worker_process.wait(timeout=60) == 0
    done = json.loads(worker_process.stderr.read().splitlines()[-1])
    assert answered_s < 1.5 and done["loaded"] and done["s"] >= 3  # answered during the import, exited after it


@needs_gpu
def test_the_cuda_load_leaves_the_context_made_and_the_checks_kernels_compiled() -> None:
    from transforms import device_check

    device_check._kernels.cache_clear()
    worker._load(["cuda"])
    assert device_check._kernels.cache_info().currsize == 1
