"""optimize on the cpu backend, with real kernels: hits, transfers, eager fallbacks and untunable ops in one report;
a second run that measures nothing; plans that compute what eager computes."""

import itertools
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from sqlalchemy import func, select

from db.index import IndexConfig
from db.migrate import upgrade
from db.models import Baseline, Demand, Measurement
from db.session import Database
from embed.importers import import_module
from service.embeddings import EncoderStore
from service.optimize import Context, OptimizeConfig, optimize
from service.optimize_report import SubgraphReport
from tests.service.conftest import DEVICE
from transforms.compilers.cpu import toolchain_id
from transforms.plan import Plan
from transforms.plan_runtime import PlanModule
from transforms.results import RunResult
from transforms.run import Worker

FAST = {"k": 2, "repeats": 3, "model_calls": 3}


class Encoder(torch.nn.Module):
    """linear -> add + layer norm: the seed model."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.n = torch.nn.Linear(32, 32), torch.nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.n(self.a(x) + x)


class WithCumsum(Encoder):
    """The seed model's layers (same shapes: hits), an op outside the op set, a new linear."""

    def __init__(self) -> None:
        super().__init__()
        self.b = torch.nn.Linear(32, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b(torch.cumsum(super().forward(x), dim=-1)))


def _graph(module: torch.nn.Module):
    return import_module(module.eval(), (torch.randn(16, 32),))


@pytest.fixture
def ctx(tmp_path: Path) -> Context:
    database = Database(f"sqlite:///{tmp_path / 'tb.db'}")
    upgrade(database.engine)
    yield Context(database, DEVICE, toolchain_id(), "cpu", tmp_path / "kernels", tmp_path / "index",
                  IndexConfig("Flat"), EncoderStore(tmp_path / "encoders"))
    database.dispose()


def _count(ctx: Context, table: type) -> int:
    with ctx.database.scope() as session:
        return int(session.scalar(select(func.count()).select_from(table)))


def test_hits_transfers_eager_fallbacks_and_an_untunable_op_in_one_report_then_a_second_run_measures_nothing(
        ctx: Context) -> None:
    # a margin no kernel can beat: every tunable subgraph falls back to eager, whatever the timings
    config = OptimizeConfig(margin=1e9, time_model=False, **FAST)
    with Worker() as worker:
        seed = optimize(_graph(Encoder()), ctx, worker=worker, config=config)
        assert {s.source for s in seed.report.subgraphs} == {"transfer"}
        assert seed.report.measured > 0 and _count(ctx, Measurement) == seed.report.measured
        first = optimize(_graph(WithCumsum()), ctx, worker=worker, config=config)
        stored = _count(ctx, Measurement)
        second = optimize(_graph(WithCumsum()), ctx, worker=worker, config=config)
    rows = {tuple(s.ops): s for s in first.report.subgraphs}
    assert rows[("matmul",)].source == rows[("add", "add", "layer_norm")].source == "hit"
    assert rows[("add", "add", "layer_norm")].candidates[0]["origin"] == "stored"
    assert rows[("opaque",)].source == "not tunable" and "cumsum" in rows[("opaque",)].reason
    assert rows[("matmul", "add", "relu")].source == "transfer"
    assert rows[("matmul", "add", "relu")].neighbours, "the seed model's GEMM is a neighbour"
    tunable = [s for s in first.report.subgraphs if s.source != "not tunable"]
    assert all(s.choice == "eager" and s.kernel_s is not None and s.eager_s is not None for s in tunable)
    assert [s.impl for s in first.plan.steps] == ["eager"] * len(first.plan.steps)
    # the second run: every tunable subgraph a hit, nothing measured, nothing stored
    assert {s.source for s in second.report.subgraphs} == {"hit", "not tunable"}
    assert second.report.measured == 0 and _count(ctx, Measurement) == stored
    assert _count(ctx, Baseline) == len({s.structural_hash for s in tunable} |
                                        {s.structural_hash for s in seed.report.subgraphs})
    queued = {s.structural_hash for s in [*seed.report.subgraphs, *first.report.subgraphs] if s.queued}
    assert queued and _count(ctx, Demand) == len(queued)


def test_the_plan_of_chosen_kernels_computes_what_eager_computes(ctx: Context) -> None:
    module = Encoder().eval()
    graph = _graph(module)
    # a negative margin chooses every validated kernel, so the plan runs generated code wherever it can
    with Worker() as worker:
        result = optimize(graph, ctx, worker=worker, config=OptimizeConfig(margin=-1.0, time_model=False, **FAST))
    assert result.plan.kernels == len(result.plan.steps) > 0
    params = {n: t.detach() for n, t in [*module.named_parameters(), *module.named_buffers()]}
    plan = PlanModule(result.plan, params, cache_dir=ctx.cache_dir)
    x = torch.randn(16, 32)
    with torch.no_grad():
        expected = module(x)
    torch.testing.assert_close(plan(x), expected, rtol=1e-4, atol=1e-5)


def test_the_whole_model_is_timed_and_never_reported_slower_than_its_all_eager_fallback(ctx: Context) -> None:
    with Worker() as worker:
        result = optimize(_graph(Encoder()), ctx, worker=worker, config=OptimizeConfig(margin=-1.0, **FAST))
    report = result.report
    assert report.model_s is not None and report.eager_model_s is not None and result.module is not None
    assert set(report.stages_s) >= {"partition", "measure", "plan", "model timing"}
    if report.model_fallback:
        assert result.plan.kernels == 0
    assert result.plan.report["model_s"] == report.model_s


@pytest.mark.parametrize(("kernel_s", "eager_s", "margin", "choice"), [
    (1.0, 2.0, 0.05, "kernel"),
    (1.0, 1.04, 0.05, "eager"),  # within the margin: eager
    (1.0, 1.06, 0.05, "kernel"),
    (None, 1.0, 0.05, "eager"),  # nothing validated
    (1.0, None, 0.05, "kernel"),  # eager cannot run it
])
def test_a_kernel_is_chosen_only_when_it_beats_eager_by_the_margin(kernel_s: float | None, eager_s: float | None,
                                                                  margin: float, choice: str) -> None:
    row = SubgraphReport("s", "reduction", "h", ["softmax"], 1, "transfer", kernel_s=kernel_s, eager_s=eager_s)
    row.choose(margin)
    assert row.choice == choice


@pytest.mark.parametrize(("plan_s", "eager_s", "fallback"), [(1.0, 2.0, False), (3.0, 2.0, True), (2.0, 2.0, True),
                                                             (1.97, 2.0, True), (1.95, 2.0, False)])
def test_the_plan_is_kept_only_when_it_beats_eager_as_a_whole(ctx: Context, monkeypatch: pytest.MonkeyPatch,
                                                             plan_s: float, eager_s: float, fallback: bool) -> None:
    import service.whole_model as whole_model

    def scripted(models: list[PlanModule], inputs: object, calls: int, **_: object) -> list[float]:  # by what runs
        return [plan_s if model.plan.kernels else eager_s for model in models]

    monkeypatch.setattr(whole_model, "compare", scripted)
    with Worker() as worker:
        result = optimize(_graph(Encoder()), ctx, worker=worker, config=OptimizeConfig(margin=-1.0, **FAST))
    assert result.report.model_fallback is fallback
    assert (result.plan.kernels == 0) is fallback and (result.module.plan.kernels == 0) is fallback
    assert result.report.model_s == (eager_s if fallback else plan_s)
    assert result.report.eager_model_s == eager_s


def test_a_plan_that_wins_once_and_loses_the_second_timing_is_not_kept(ctx: Context,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import service.whole_model as whole_model

    rounds = itertools.count()

    def noisy(models: list[PlanModule], inputs: object, calls: int, **_: object) -> list[float]:  # eager slow once
        plan_s = 1.0 if next(rounds) == 0 else 2.0
        return [plan_s if model.plan.kernels else 2.0 for model in models]

    monkeypatch.setattr(whole_model, "compare", noisy)
    with Worker() as worker:
        result = optimize(_graph(Encoder()), ctx, worker=worker, config=OptimizeConfig(margin=-1.0, **FAST))
    assert next(rounds) == 2  # timed twice
    assert result.report.model_fallback and result.plan.kernels == 0


@pytest.mark.parametrize(("kernel_s", "eager_s", "choice", "tied"), [
    (1.0, 1.04, "eager", True),  # faster, within the margin: a tie
    (1.0, 1.0, "eager", False),  # not faster
    (1.05, 1.0, "eager", False),  # slower
    (1.0, 2.0, "kernel", False),  # chosen already
    (None, 1.0, "eager", False),  # nothing validated
])
def test_a_kernel_faster_than_eager_within_the_margin_is_a_tie_the_whole_model_decides(
        kernel_s: float | None, eager_s: float, choice: str, tied: bool) -> None:
    from types import SimpleNamespace

    from service.optimize import _ties_as_kernels
    from transforms.plan import Step

    subgraphs = [SimpleNamespace(structural_hash="a"), SimpleNamespace(structural_hash="b")]
    rows = {"a": SubgraphReport("a", "reduction", "a", ["softmax"], 1, "transfer", recipe="r", kernel_s=kernel_s,
                                eager_s=eager_s, choice=choice),
            "b": SubgraphReport("b", "reduction", "b", ["softmax"], 1, "bound", eager_s=1.0, choice="eager")}
    steps = [Step("a", "kernel" if choice == "kernel" else "eager"), Step("b", "eager")]
    kernels = SimpleNamespace(step=lambda subgraph, recipe: Step(subgraph.structural_hash, "kernel"))
    found = _ties_as_kernels(steps, subgraphs, rows, kernels, 0.05)
    if tied:
        assert found == ((Step("a", "kernel"), Step("b", "eager")), {"a"})
    else:
        assert found is None


@pytest.mark.parametrize("tied_s", [1.0, 3.0])
def test_the_plan_with_its_tied_kernels_is_timed_whole_and_kept_only_when_faster(
        ctx: Context, monkeypatch: pytest.MonkeyPatch, tied_s: float) -> None:
    import service.measure
    import service.whole_model as whole_model

    def scripted(models: list[PlanModule], inputs: object, calls: int, **_: object) -> list[float]:  # by what runs
        return [tied_s if model.plan.kernels else 2.0 for model in models]

    monkeypatch.setattr(whole_model, "compare", scripted)
    monkeypatch.setattr(service.measure, "eager_seconds", lambda task, **_: 1.0)  # every kernel beats eager
    with Worker() as worker:  # no margin a kernel can beat: every kernel faster than eager ties with it
        result = optimize(_graph(Encoder()), ctx, worker=worker, config=OptimizeConfig(margin=1e9, **FAST))
    report = result.report
    ties = [r for r in report.subgraphs if r.kernel_s is not None and r.kernel_s < r.eager_s]
    assert len(ties) == 2  # the control: the linear and the add + layer norm
    assert set(report.ways_s) == {"plan", "plan with tied kernels"}
    assert report.ways_s["plan with tied kernels"] == tied_s and report.ways_s["plan"] == 2.0
    if tied_s < 2.0:  # kept: its kernels run, and the report says why
        assert result.plan.kernels == len(ties) and not report.model_fallback and report.model_s == tied_s
        assert all(r.choice == "kernel" and "whole model ran faster" in r.reason for r in ties)
    else:  # slower: the plan as chosen (all eager here, so eager itself)
        assert result.plan.kernels == 0 and all(r.choice == "eager" for r in ties)


def test_a_tied_plan_that_cannot_run_here_leaves_the_other_ways_timed(ctx: Context,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import service.measure
    import service.whole_model as whole_model
    from transforms.plan import PlanError

    def refusing(plan: Plan, *args: object, **kwargs: object) -> PlanModule:  # the tied plan alone has kernels
        if plan.kernels:
            raise PlanError("a kernel this machine cannot run")
        return PlanModule(plan, *args, **kwargs)

    monkeypatch.setattr(whole_model, "PlanModule", refusing)
    monkeypatch.setattr(whole_model, "compare", lambda models, inputs, calls, **_: [2.0, 1.0][:len(models)])
    monkeypatch.setattr(service.measure, "eager_seconds", lambda task, **_: 1.0)  # every kernel ties with eager
    with Worker() as worker:
        result = optimize(_graph(Encoder()), ctx, worker=worker, config=OptimizeConfig(margin=1e9, **FAST))
    assert result.report.ways_s == {"plan": 1.0} and result.module is not None and result.plan.kernels == 0


class TransposeBetweenKernels(torch.nn.Module):
    """linear + gelu, a transpose, softmax: a layout subgraph between two kernel subgraphs."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(32, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(torch.nn.functional.gelu(self.a(x)).transpose(0, 1), dim=-1)


def test_a_transpose_between_two_kernels_costs_no_kernel_of_its_own(ctx: Context) -> None:
    module = TransposeBetweenKernels().eval()
    graph = _graph(module)
    # every validated kernel chosen; a fold kept whenever it validates, so no machine's timing decides the plan
    config = OptimizeConfig(margin=-1.0, fold_margin=1e9, time_model=False, **FAST)
    with Worker() as worker:
        result = optimize(graph, ctx, worker=worker, config=config)
    kinds = [s.kind for s in result.report.subgraphs]
    assert kinds == ["contraction", "layout", "reduction"]
    steps = result.plan.steps
    assert [s.impl for s in steps] == ["kernel", "folded", "kernel"] and result.plan.kernels == 2
    assert result.plan.folds in ({1: 0}, {1: 2})  # into the GEMM's store or the softmax's loads
    params = {n: t.detach() for n, t in module.named_parameters()}
    plan = PlanModule(result.plan, params, cache_dir=ctx.cache_dir)
    x = torch.randn(16, 32)
    with torch.no_grad():
        expected = module.double()(x.double())
    torch.testing.assert_close(plan(x).double(), expected, rtol=1e-4, atol=1e-6)


class _RefusingWorker(Worker):
    """A worker whose every trial fails the way a refused launch does."""

    def request(self, message: dict, timeout_s: float) -> RunResult:
        return RunResult.failure("launch", "CUDADriverError: CUDA_ERROR_INVALID_VALUE (planted)")


def test_a_failed_candidate_says_why_in_the_report(ctx: Context) -> None:
    config = OptimizeConfig(time_model=False, **FAST)
    with _RefusingWorker() as worker:
        result = optimize(_graph(Encoder()), ctx, worker=worker, config=config)
    tried = [c for s in result.report.subgraphs for c in s.candidates]
    assert tried and all(c["seconds"] is None and c["error"] == "launch" for c in tried)
    assert {c["message"] for c in tried} == {"CUDADriverError: CUDA_ERROR_INVALID_VALUE (planted)"}
    assert {s.choice for s in result.report.subgraphs if s.candidates} == {"eager"}


class RecordingWorker(Worker):
    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def prepare(self, problems, backend, **options):
        self.events.append(f"prepare {len(problems)}")
        super().prepare(problems, backend, **options)

    def settle(self):
        self.events.append("settle")
        return super().settle()

    def request(self, message, timeout_s):
        self.events.append("trial")
        return super().request(message, timeout_s)


def test_eager_is_timed_before_the_worker_builds_problems_and_the_worker_is_settled_before_the_model_is_timed(
        ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    import service.measure
    import service.optimize

    events: list[str] = []
    eager, choose = service.measure.eager_seconds, service.optimize.choose_runtime
    monkeypatch.setattr(service.measure, "eager_seconds", lambda *a, **k: events.append("eager") or eager(*a, **k))
    monkeypatch.setattr(service.optimize, "choose_runtime",
                        lambda *a, **k: events.append("model") or choose(*a, **k))
    with RecordingWorker(events) as worker:
        result = optimize(_graph(WithCumsum()), ctx, worker=worker, config=OptimizeConfig(**FAST))
    transfers = sum(s.source == "transfer" for s in result.report.subgraphs)
    assert transfers == 3 and events.count("eager") == transfers
    assert events[:transfers + 1] == ["eager"] * transfers + [f"prepare {transfers}"]
    assert "trial" in events and events.index("settle") > max(i for i, e in enumerate(events) if e == "trial")
    assert events.index("settle") < events.index("model")


@pytest.mark.parametrize(("eager_us", "measured"), [(5.9, False), (6.1, True)])
def test_a_subgraph_eager_runs_under_half_its_roofline_bound_is_not_measured(eager_us: float, measured: bool) -> None:
    from dataclasses import replace as replaced

    from service.optimize import _under_bound
    from service.optimize_report import SubgraphReport
    from tests.transforms.kernels import single
    from transforms.tune import make_task

    # add of two 1000-element float32 vectors: 12,000 bytes at least (two read, one written), 1,000 flops; at 1 GB/s
    # and 1 Tflop/s the bound is 12 us, so eager under 6 us moves no data (a view)
    task = make_task(single("add", [("a", (1000,), "float32"), ("b", (1000,), "float32")], (1000,)))
    device = replaced(DEVICE, bandwidth_gbps=1.0, peak_gflops=1000.0)
    row = SubgraphReport("add", "elementwise", "h", ["add"], 1, "transfer")
    assert _under_bound(task, row, eager_us * 1e-6, device) is not measured
    if not measured:
        assert row.source == "bound" and row.choice == "eager" and row.eager_s == pytest.approx(5.9e-6)
        assert "under half the 12 us any kernel needs" in row.reason
    assert not _under_bound(task, row, math.nan, device)  # eager cannot run it: measure


def test_subgraphs_eager_runs_under_their_bound_get_no_trial(ctx: Context) -> None:
    # a device so slow on paper that eager beats what any kernel could do on every subgraph
    slow = Context(**{**ctx.__dict__, "device": replace(DEVICE, bandwidth_gbps=1e-6, peak_gflops=1e-6)})
    events: list[str] = []
    with RecordingWorker(events) as worker:
        result = optimize(_graph(WithCumsum()), slow, worker=worker, config=OptimizeConfig(time_model=False, **FAST))
    tunable = [s for s in result.report.subgraphs if s.source != "not tunable"]
    assert tunable and all(s.source == "bound" and s.choice == "eager" and not s.candidates for s in tunable)
    assert "trial" not in events and result.report.measured == 0 and result.plan.kernels == 0


def test_a_device_that_measured_nothing_transfers_from_the_devices_of_its_class(ctx: Context, tmp_path: Path) -> None:
    config = OptimizeConfig(margin=1e9, time_model=False, **FAST)

    def on(name: str, device_class: str) -> Context:  # another machine: its own encoders and index files
        return replace(ctx, device=replace(DEVICE, name=name, device_class=device_class),
                       encoders=EncoderStore(tmp_path / name / "encoders"), index_dir=tmp_path / name / "index")

    head = _graph(torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU()))
    with Worker() as worker:
        optimize(_graph(Encoder()), ctx, worker=worker, config=config)  # "cpu:test" measures and profiles the seed
        sibling = optimize(head, on("cpu:sibling", DEVICE.device_class), worker=worker, config=config)
        seed_again = optimize(_graph(Encoder()), on("cpu:sibling", DEVICE.device_class), worker=worker, config=config)
        stranger = optimize(head, on("cpu:stranger", "cpu:other"), worker=worker, config=config)
    (gemm,) = sibling.report.subgraphs
    assert gemm.source == "transfer" and gemm.neighbours  # the seed model's GEMM, measured on "cpu:test" only
    assert {n["lent_by"] for n in gemm.neighbours} == {DEVICE.name}
    assert {s.source for s in seed_again.report.subgraphs} == {"transfer"}  # hits stay this device's own
    assert not any(s.neighbours for s in stranger.report.subgraphs)  # another class lends nothing


def test_a_transfer_chooses_the_fastest_kernel_stored_for_the_subgraph_not_only_this_runs(ctx: Context) -> None:
    from embed.partition import partition_nodes
    from service.measurement_store import MeasurementStore
    from service.transfer import random_recipes
    from transforms.space import RecipeSpace
    from transforms.tune import make_task

    graph = _graph(Encoder())
    first = next(s for s, _ in partition_nodes(graph) if s.tunable)
    task = replace(make_task(first), key=first.structural_hash)
    stored = random_recipes(RecipeSpace(task.program, "cpu"), 40, seed=7)[-1]  # what an interrupted run measured
    store = MeasurementStore(ctx.database, ctx.device, ctx.toolchain, [first])
    store.measured(task, [stored], [RunResult(ok=True, median_s=1e-9, repeats=1)])
    with Worker() as worker:
        result = optimize(graph, ctx, worker=worker, config=OptimizeConfig(time_model=False, **FAST))
    row = next(s for s in result.report.subgraphs if s.structural_hash == first.structural_hash)
    assert row.source == "transfer" and str(stored) not in {c["recipe"] for c in row.candidates}  # not tried again
    assert (row.recipe, row.kernel_s, row.choice) == (str(stored), 1e-9, "kernel")  # as a hit would choose later


@pytest.mark.parametrize(("backend", "eager_us", "share", "wanted"), [
    ("cuda", 10.1, 0.5, 0), ("cuda", 9.9, 0.5, 5), ("cpu", 50.0, 0.5, 5), ("cuda", 9.9, 0.019, 1)])
def test_a_convolution_cudnn_runs_in_10_us_or_more_tries_only_its_default_and_the_library(
        backend: str, eager_us: float, share: float, wanted: int) -> None:
    from service.optimize import _candidates_wanted
    from tests.transforms.test_vendor import conv_block, subgraphs
    from transforms.tune import make_task

    row = SubgraphReport("conv", "conv", "h", ["conv2d"], 1, "transfer")
    task = make_task(subgraphs(conv_block(), "conv2d")[0])
    assert _candidates_wanted(task, row, share, eager_us * 1e-6, backend, OptimizeConfig(k=5)) == wanted
    assert (row.reason is None) == (wanted == 5)


@pytest.mark.parametrize(("share", "wanted"), [(0.0199, 1), (0.0201, 5), (math.nan, 5)])
def test_a_subgraph_under_2_percent_of_the_model_tries_one_neighbours_recipe(share: float, wanted: int) -> None:
    from service.optimize import _candidates_wanted
    from tests.transforms.test_vendor import conv_block, subgraphs
    from transforms.tune import make_task

    row = SubgraphReport("linear", "contraction", "h", ["matmul"], 1, "transfer")
    task = make_task(subgraphs(conv_block(), "matmul")[0])
    assert _candidates_wanted(task, row, share, 1e-3, "cuda", OptimizeConfig(k=5)) == wanted
    if wanted == 1:
        assert row.reason.startswith("2.0% of the model's eager time")


def test_optimize_gives_a_subgraph_a_minor_share_of_the_models_eager_time_one_candidate(
        ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    import service.measure

    # eager: 1 ms for each subgraph but the layer norm's 10 us, 10 / 2010 = 0.5% of the model (counted once each)
    monkeypatch.setattr(service.measure, "eager_seconds",
                        lambda task, **_: 1e-5 if any(n.op == "layer_norm" for n in task.program.nests) else 1e-3)
    with Worker() as worker:
        result = optimize(_graph(WithCumsum()), ctx, worker=worker,
                          config=OptimizeConfig(time_model=False, explore=True, **FAST))  # random fill: no neighbours
    rows = {"+".join(s.ops): s for s in result.report.subgraphs if s.source == "transfer"}
    assert len(rows) == 3
    for ops, row in rows.items():
        others = [c for c in row.candidates if c["origin"] not in ("default", "library")]
        minor = "layer_norm" in ops
        assert len(others) == (1 if minor else FAST["k"]), (ops, row.candidates)
        assert (row.reason or "").startswith("0.5% of the model's eager time") == minor


class ConvThenLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c, self.l = torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l(torch.relu(self.c(x)).flatten(1))


def test_subgraphs_with_convolutions_are_transferred_last_and_reported_in_partition_order(
        ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    import service.optimize

    transferred, prepared = [], []
    transfer = service.optimize._transfer
    monkeypatch.setattr(service.optimize, "_transfer", lambda task, row, *a: transferred.append(
        (row.ops, task.problem)) or transfer(task, row, *a))

    class PreparingWorker(Worker):
        def prepare(self, problems, backend, **options):
            prepared.extend(problems)
            super().prepare(problems, backend, **options)

    graph = import_module(ConvThenLinear().eval(), (torch.randn(2, 3, 6, 6),))
    with PreparingWorker() as worker:
        result = optimize(graph, ctx, worker=worker, config=OptimizeConfig(**FAST, time_model=False))
    convolves = ["conv2d" in ops for ops, _ in transferred]
    assert len(transferred) >= 2 and convolves[-1] and not any(convolves[:-1])  # the worker imports torch meanwhile
    assert len(prepared) == len(transferred) and all(p is q for p, (_, q) in zip(prepared, transferred, strict=True))
    assert "conv2d" in result.report.subgraphs[0].ops  # the report keeps the partition's order


def test_every_subgraphs_candidates_are_queued_to_compile_before_the_first_is_measured(
        ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    import service.optimize

    events = []
    measure = service.optimize.measure_candidates
    monkeypatch.setattr(service.optimize, "compile_ahead", lambda task, recipes, **_: events.append(
        ("ahead", task.key, [str(r) for r in recipes])))
    monkeypatch.setattr(service.optimize, "measure_candidates", lambda task, key, *a, **o: events.append(
        ("measure", key, None)) or measure(task, key, *a, **o))
    with Worker() as worker:
        result = optimize(_graph(WithCumsum()), ctx, worker=worker,
                          config=OptimizeConfig(time_model=False, explore=True, **FAST))
    kinds = [kind for kind, _, _ in events]
    transferred = [h for kind, h, _ in events if kind == "measure"]
    assert len(transferred) >= 2 and kinds == ["ahead"] * len(transferred) + ["measure"] * len(transferred)
    assert [h for kind, h, _ in events if kind == "ahead"] == transferred  # queued in the order they are measured
    tried = {row.structural_hash: [c["recipe"] for c in row.candidates] for row in result.report.subgraphs}
    for _, h, recipes in events[:len(transferred)]:
        assert recipes == tried[h]  # what compiles ahead is what is then tried


def test_the_worker_loads_cupy_the_problem_builder_and_torch_on_cuda_and_nothing_on_cpu() -> None:
    from service.optimize import convolves, worker_loads

    assert convolves(import_module(ConvThenLinear().eval(), (torch.randn(2, 3, 6, 6),)))
    assert not convolves(_graph(WithCumsum()))
    assert worker_loads("cuda") == ("cuda", "problems", "problem-kernels", "torch")
    assert worker_loads("cpu") == ()


def test_on_cuda_a_contraction_cublaslt_runs_tries_no_generated_cuda_core_gemm_nor_its_lower_ranks() -> None:
    import re
    from types import SimpleNamespace

    import service.optimize
    from embed.partition import partition
    from service.transfer import candidates
    from transforms.space import RecipeSpace
    from transforms.tune import make_task

    def tried(module: torch.nn.Module, x: torch.Tensor) -> tuple[RecipeSpace, list[str], list[str]]:
        """The space of the module's contraction, the candidates the fill offers, and those optimize keeps."""
        (contraction,) = [s for s in partition(import_module(module.eval(), (x,))) if "matmul" in s.ops]
        task, config = make_task(contraction), OptimizeConfig(k=24, explore=True)  # past the vendor ranks: simt gemms
        space = RecipeSpace(task.program, "cuda")
        offered = candidates(space, [], wanted=config.k, seed=config.seed, fill=True, library=True, explore=True)
        store = SimpleNamespace(ids={contraction.structural_hash: 1}, device_id=1)
        search = SimpleNamespace(open=lambda: None, encoder=None, index=None)
        found = service.optimize._neighbours(contraction, task, SimpleNamespace(backend="cuda"), store, None, search,
                                             config, service.optimize._Stages(), config.k)
        return space, [str(r) for r in offered], [str(r) for r in found.candidates]

    def lt_rank(recipe: str) -> tuple[int, bool] | None:
        match = re.fullmatch(r"gemm\(cublaslt,(\d+)(,batched)?\)", recipe)
        return (int(match[1]), bool(match[2])) if match else None

    # a batched contraction (3-d input) offers the batched call's ranks too
    space, offered, kept = tried(torch.nn.Linear(64, 96), torch.randn(4, 32, 64))
    assert str(space.default).startswith("gemm(cublaslt")
    ranks = [r for r in map(lt_rank, offered) if r is not None]
    assert any(rank >= 3 for rank, batched in ranks if not batched) and any(rank >= 1 for rank, b in ranks if b)
    assert any(r.startswith("gemm(simt") for r in offered)  # the control: the fill offers them
    assert kept == [r for r in offered if not r.startswith("gemm(simt") and
                    ((rank := lt_rank(r)) is None or rank[0] < (1 if rank[1] else 3))]
    assert "gemm(cublaslt,2)" in kept and "gemm(cublaslt,0,batched)" in kept and "gemm(cublas)" in kept
    # in float64 the default is a generated gemm, cuBLASLt one candidate among others: no simt gemm is left out
    space, offered, kept = tried(torch.nn.Linear(64, 96).double(), torch.randn(32, 64, dtype=torch.float64))
    assert str(space.default).startswith("gemm(simt") and str(space.default) in kept
    assert [r for r in offered if r.startswith("gemm(simt")] == [r for r in kept if r.startswith("gemm(simt")]
