"""``optimize``: a model graph -> a plan (``transforms.plan``) and its report, storing everything it measures.

Per distinct subgraph, in partition order:

* not tunable (an op outside the op set): runs eagerly, with the reason in the report;
* **hit**: the database holds, for this device and toolchain, an ok measurement of the subgraph and its eager
  time: the stored best recipe is reused with no search and nothing is run;
* **transfer**: otherwise the subgraph is embedded with the promoted encoder (the first of learned,
  static+profiled, static that has a promoted version; with none, ``static`` is fitted once on the device's
  profiled subgraphs, or where it has none on those of another device of its class, saved and promoted), its k
  nearest neighbours come from the persistent vector index (``TUNEBANK_INDEX_FACTORY``; a neighbour never measured
  on this device lends the recipe another device of its class measured fastest, e.g. an H100's on an H200, and the
  report names that device), their recipes are adapted, filled, validated and timed (``service.transfer.candidates``,
  ``measure_candidates``) beside the vendor libraries' own implementations (cuDNN for a convolution: candidates
  however many neighbours there are), and eager PyTorch is timed too. Each batch of
  measurements is stored as soon as it is taken, so Ctrl-C or a crash loses none (and a rerun measures none of them
  again, and chooses among them and its own candidates the fastest, as a hit on the run after it would); the
  subgraph's baseline, profile and embedding follow.
  A subgraph with no neighbour of its kind, or whose nearest is farther than ``far_distance``, is queued for the
  crawler (``demand``);
* **bound**: a subgraph to transfer whose eager time is under half its roofline bound (eager moved no data: a view)
  runs eagerly with nothing measured (``_under_bound``).

Eager is timed for every subgraph to transfer first, in this process, on the GPU; then they are transferred in
partition order, but those with convolutions last (their library candidates need torch, which a cuda worker imports
meanwhile), the worker building their problems ahead while this process looks up neighbours and compiles candidates
(``Worker.prepare``), and is settled (``Worker.settle``) before this process times on the GPU again, so no timing
shares the GPU with a problem built.

The eager implementation is always a candidate: a kernel is chosen only when it is faster than eager by more than
``margin`` (default 5%: within that, timing noise decides, and eager costs nothing to keep). Then the model is run
whole and timed (``service.model_timing``) in each way it can run: the plan, on cuda with and without one CUDA
graph, and the all-eager plan in one CUDA graph; the fastest is kept, and when none beats the model run eagerly,
the plan becomes all-eager without a graph (which is eager): a plan is never slower than eager as a whole either.

An attention (score matmul, scaled softmax, output matmul) runs as PyTorch's fused scaled dot-product attention where
that validates and beats its three steps as chosen by more than ``margin`` (``service.fused_attention``); this is
decided before layout steps are folded, so no fold hides a tensor the fused call reads.

Layout subgraphs (transpose, reshape, slice, ...) cost nothing where they can: before the model is timed, each one
next to a kernel step is tried folded into it (``transforms.plan.fold_side``: into the store of the kernel it
reads, or the loads of the kernel that alone reads it), the kernel regenerated from the merged subgraph with the
same recipe, validated and timed; the fold is kept when that kernel is not slower than the kernel and the layout
step as they were timed apart, by more than ``fold_margin`` (5%: the per-subgraph times leave out what a step costs
in the plan, a launch, an output allocation, which a fold saves). A layout step that eager runs as a view is charged,
beside the kernel that loads it, what copying it costs (that kernel reads a strided view contiguous: the copy is its
default recipe's kernel, measured). A layout step left eager is a view where no data moves until a kernel reads it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from sqlalchemy import select

from db.index import IndexConfig, VectorIndex
from db.migrate import check_schema
from db.models import Device
from db.repositories.baselines import eager_times, request_crawl
from db.repositories.embeddings import EmbeddingIn, IndexKey, add_embeddings
from db.repositories.model_catalog import add_model
from db.repositories.rankings import best_recipes, stored_results
from db.session import Database
from embed.encoders import Encoder, FeatureSet
from embed.errors import EmbedError
from embed.features import static_features
from embed.ir import Graph
from embed.partition import partition_nodes
from embed.profile import DeviceSpec, roofline_bound
from embed.subgraph import Subgraph, SubgraphKind
from service.crawl import profile_vector
from service.embeddings import EncoderStore, embed_subgraphs, fit_encoder, profile_sources, profiled_subgraphs
from service.fused_attention import fuse_attentions
from service.measure import MeasurementTable, Measurer, live_measurer
from service.measurement_store import MeasurementStore
from service.optimize_report import OptimizeReport, SubgraphReport
from service.store import static_vector
from service.transfer import Neighbour, candidates, measure_candidates, neighbours
from service.whole_model import choose_runtime
from transforms.build import Ahead
from transforms.convolution import match_convolution
from transforms.plan import LOAD, Parts, Plan, Step, Target, content_hash, fold_side, kernel_step, step_subgraph
from transforms.plan_runtime import PlanModule
from transforms.recipe import Recipe, parse
from transforms.recipe import Step as RecipeStep
from transforms.results import RunResult
from transforms.run import Worker
from transforms.schedule import ScheduleError
from transforms.space import RecipeSpace, default_recipe
from transforms.tune import Task, compile_ahead, make_task

ENCODER_PREFERENCE = ("learned", "static+profiled", "static")
Progress = Callable[[int, int, str], None]  # (subgraphs done, distinct subgraphs, what is running)


@dataclass(frozen=True)
class OptimizeConfig:
    """Knobs of one optimize run. ``margin``: how much faster than eager a kernel must be to be chosen;
    ``far_distance``: a nearest neighbour farther than this (in the encoder's distance) queues the subgraph for the
    crawler; ``model_calls``: calls timed per whole-model measurement; ``model_margin``: how much faster than eager
    the whole plan must be to be kept (whole-model timings move by a percent or two between runs); ``fold_margin``:
    how much slower than a kernel and a layout step timed apart their merged kernel may be and still be kept;
    ``minor_share``: a subgraph under this share of the model's eager time (its occurrences counted) tries, beside
    its default recipe and the library calls, only its nearest neighbour's recipe (``_candidates_wanted``);
    ``explore``: the places the neighbours leave are filled with uniform random recipes too, after their variants and
    the vendor-ranked ones (off: over the s15-s23 H200 rows they saved at most 0.48% of a model, for 9% of the
    trials, ``bench/README.md``, twenty-fourth session; the crawler explores instead)."""

    k: int = 5
    margin: float = 0.05
    far_distance: float = 4.0
    fill: bool = True
    seed: int = 0
    repeats: int = 10
    time_model: bool = True
    model_calls: int = 50
    model_margin: float = 0.02
    compare_compile: bool = True
    fold_margin: float = 0.05
    minor_share: float = 0.02
    explore: bool = False


@dataclass
class Optimized:
    plan: Plan
    report: OptimizeReport
    module: PlanModule | None = None  # the plan bound to the weights it was timed with
    params: Mapping[str, torch.Tensor] | None = None  # the model's own weights, when they are known


@dataclass
class Context:
    """Where optimize runs: database, device, toolchain, backend, kernel cache, index and encoder stores."""

    database: Database
    device: DeviceSpec
    toolchain: str
    backend: str
    cache_dir: Path
    index_dir: Path
    index_config: IndexConfig
    encoders: EncoderStore


class _Stages:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, started: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started


def optimize(graph: Graph, ctx: Context, *, worker: Worker, config: OptimizeConfig = OptimizeConfig(),
             params: Mapping[str, torch.Tensor] | None = None, inputs: Sequence[torch.Tensor] | None = None,
             reference: Callable[..., object] | None = None, progress: Progress | None = None,
             name: str = "") -> Optimized:
    """Optimize ``graph`` on ``ctx``'s device: the plan, its report, and (when ``config.time_model``) the plan
    bound to ``params`` (random weights when not given) and timed whole on ``inputs`` (random when not given)
    against ``reference`` (the user's own module; by default the graph run eagerly)."""
    check_schema(ctx.database.engine)
    worker.warm(worker_loads(ctx.backend))  # loads beside the partition, lookups and eager timings
    stages = _Stages()
    started = time.perf_counter()
    parts = partition_nodes(graph)
    subgraphs = [s for s, _ in parts]
    distinct = {s.structural_hash: s for s in subgraphs}
    store = MeasurementStore(ctx.database, ctx.device, ctx.toolchain, list(distinct.values()))
    with ctx.database.scope() as session:
        add_model(session, name=(name or graph.name)[:200], content_hash=content_hash(graph),
                  subgraph_hashes=[s.structural_hash for s in subgraphs if s.tunable])
    stages.add("partition", started)
    report = OptimizeReport(name or graph.name, ctx.backend, ctx.device.name, ctx.toolchain)
    measurer = live_measurer(MeasurementTable(ctx.device, ctx.toolchain), backend=ctx.backend,
                             cache_dir=ctx.cache_dir, worker=worker, repeats=config.repeats, record=store.measured)
    search = _Search(ctx, store.device_id, stages)
    kernels = _Kernels(ctx.backend)
    count = {h: sum(s.structural_hash == h for s in subgraphs) for h in distinct}
    rows = [SubgraphReport(f"{graph.name} #{n} ({'+'.join(s.ops)[:60]})", s.kind.value, h, s.ops, count[h],
                           "not tunable", s.not_tunable_reason) for n, (h, s) in enumerate(distinct.items())]
    started = time.perf_counter()
    transfers = {h: stored for (h, s), row in zip(distinct.items(), rows, strict=True)
                 if s.tunable and (stored := _look_up(s, row, ctx, store, kernels, config)) is not None}
    tasks = {h: replace(make_task(distinct[h], seed=config.seed), key=h) for h in transfers}
    stages.add("lookup", started)
    if progress:
        progress(0, len(distinct), "eager timings")
    started = time.perf_counter()
    eager = {h: measurer.eager(task, h) for h, task in tasks.items()}  # on the GPU before the worker builds there
    for h, row in zip(distinct, rows, strict=True):
        if h in tasks and _under_bound(tasks[h], row, eager[h], ctx.device):
            del tasks[h]
    stages.add("eager", started)
    model_eager_s = sum(count[h] * s for h, row in zip(distinct, rows, strict=True)
                        if (s := eager.get(h, row.eager_s)) is not None and math.isfinite(s))
    # subgraphs with convolutions last: their library candidates need torch, which a cuda worker imports meanwhile
    convolving = {h for h, task in tasks.items() if convolves(task.graph)}
    order = sorted(tasks, key=lambda h: h in convolving)  # stable: the partition's order otherwise
    worker.prepare([tasks[h].problem for h in order], ctx.backend,
                   warm=("cudnn",) if ctx.backend == "cuda" and convolving else ())
    by_hash = dict(zip(distinct, rows, strict=True))
    lookups = {}
    for h in order:
        measurer.table.results.setdefault(h, {}).update(transfers[h])  # an interrupted run's are not run again
        share = count[h] * eager[h] / model_eager_s if model_eager_s else 1.0
        wanted = _candidates_wanted(tasks[h], by_hash[h], share, eager[h], ctx.backend, config)
        lookups[h] = _neighbours(distinct[h], tasks[h], ctx, store, measurer, search, config, stages, wanted)
    with Ahead(cache_dir=ctx.cache_dir, jobs=os.cpu_count() or 4) as ahead:
        for h in order:
            left = [r for r in lookups[h].candidates if str(r) not in measurer.table.results[h]]
            compile_ahead(tasks[h], left, backend=ctx.backend, ahead=ahead, best_s=measurer.table.fastest(h))
        for n, h in enumerate(order):
            if progress:
                progress(len(distinct) - len(order) + n, len(distinct), "+".join(distinct[h].ops)[:60])
            _transfer(tasks[h], by_hash[h], lookups[h], ctx, store, measurer, config, stages)
    report.subgraphs.extend(rows)
    report.built_ahead = worker.settle()  # the worker builds nothing more: the parent times on the GPU from here
    if progress:
        progress(len(distinct), len(distinct), "plan")
    started = time.perf_counter()
    chosen = {r.structural_hash: r for r in report.subgraphs}
    steps = [kernels.plan_step(s, chosen[s.structural_hash]) for s in subgraphs]
    seconds = [_step_seconds(chosen[s.structural_hash]) for s in subgraphs]
    report.attentions = fuse_attentions(graph, parts, steps, seconds, store, backend=ctx.backend,
                                        margin=config.margin, params=params, repeats=config.repeats, seed=config.seed)
    before = measurer.evaluations
    folder = _Folder(graph, parts, chosen, ctx.backend, store, measurer, config.seed, config.fold_margin)
    steps = folder.fold(steps)
    report.measured, report.folds_measured = measurer.evaluations, measurer.evaluations - before
    target = Target(ctx.backend, ctx.device.name, ctx.device.device_class, ctx.device.arch, ctx.toolchain)
    plan = Plan(graph, tuple(steps), target)
    stages.add("plan", started)
    module = None
    if config.time_model:
        started = time.perf_counter()
        tied = _ties_as_kernels(steps, subgraphs, chosen, kernels, config.margin)
        plan, module = choose_runtime(plan, report, backend=ctx.backend, cache_dir=ctx.cache_dir, params=params,
                                      inputs=inputs, reference=reference, calls=config.model_calls,
                                      margin=config.model_margin, compare_compile=config.compare_compile,
                                      seed=config.seed, ties=replace(plan, steps=tied[0]) if tied else None)
        if tied and plan.steps == tied[0]:
            for h in tied[1]:
                chosen[h].choice = "kernel"
                why = "within the margin of eager, but the whole model ran faster with its kernel"
                chosen[h].reason = f"{chosen[h].reason}; {why}" if chosen[h].reason else why
        stages.add("model timing", started)
    report.stages_s = stages.seconds
    plan = replace(plan, report=report.to_json())
    if module is not None:
        module.plan = plan
    return Optimized(plan, report, module, params)


def worker_loads(backend: str) -> tuple[str, ...]:
    """What the worker loads ahead (``transforms.worker.LOADS``): on cuda CuPy and the CUDA context, what it builds
    problems with and the kernels they all run, and torch (cuDNN's trials run through it, and problems take their
    references from it once it is in); nothing on cpu, whose trials are timed by the wall clock beside whatever holds
    the interpreter."""
    return ("cuda", "problems", "problem-kernels", "torch") if backend == "cuda" else ()


def convolves(graph: Graph) -> bool:
    """Whether ``graph`` has a convolution."""
    return any(node.op == "conv2d" for node in graph.nodes)


class _Kernels:
    """Kernel steps generated once per (subgraph, recipe): a hit checks that its stored recipe still generates a
    kernel here (stored by an older tunebank, it may not), and the plan uses that step for every occurrence."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.made: dict[tuple[str, str], Step | None] = {}

    def step(self, subgraph: Subgraph, recipe: str) -> Step | None:
        key = (subgraph.structural_hash, recipe)
        if key not in self.made:
            try:
                self.made[key] = kernel_step(subgraph, recipe, self.backend)
            except (ScheduleError, EmbedError, ValueError):
                self.made[key] = None
        return self.made[key]

    def plan_step(self, subgraph: Subgraph, row: SubgraphReport) -> Step:
        """The kernel ``row`` chose, or the eager step."""
        chosen = self.step(subgraph, row.recipe) if row.choice == "kernel" and row.recipe is not None else None
        return chosen or Step(subgraph.structural_hash, "eager")


class _Folder:
    """Layout steps folded into a neighbouring kernel step where that validates and is faster (module docstring).
    A fold is measured as the merged subgraph (kernel and layout ops) with the neighbour's recipe, and stored like
    any measurement, so a rerun finds it and measures nothing. Its program has the layout ops as index maps: the
    program any merged subgraph gets where a view of a contraction's output is its store, and one a partition of
    its own never makes otherwise (layout ops beside kernels are subgraphs of their own).

    A layout step that eager runs as a view (``bound``) costs nothing by itself, but the kernel that loads it reads
    its inputs contiguous, so a strided view is copied first: apart, such a step costs what its copy kernel (its
    default recipe, measured here once) takes."""

    def __init__(self, graph: Graph, parts: Parts, chosen: Mapping[str, SubgraphReport], backend: str,
                 store: MeasurementStore, measurer: Measurer, seed: int, margin: float) -> None:
        self.graph, self.parts, self.backend, self.measurer, self.seed = graph, parts, backend, measurer, seed
        self.store, self.margin = store, margin
        self.seconds = [_step_seconds(chosen[s.structural_hash]) for s, _ in parts]
        self.views = [chosen[s.structural_hash].source == "bound" for s, _ in parts]
        self.copies: dict[str, float] = {}

    def fold(self, steps: list[Step]) -> list[Step]:
        for j, (sub, _) in enumerate(self.parts):
            if sub.kind != SubgraphKind.LAYOUT or steps[j].impl == "folded" or self.seconds[j] is None:
                continue
            best: tuple[float, int, Step] | None = None
            for k, step in enumerate(steps):
                apart, side = self.seconds[k], fold_side(self.graph, self.parts, k, j)
                if step.impl != "kernel" or apart is None or side is None:
                    continue
                made = self._try(step, k, (*step.folded, j))
                if made is None or (best is not None and made[0] >= best[0]):
                    continue
                if made[0] <= (apart + self._layout_seconds(j, side)) * (1 + self.margin):
                    best = (made[0], k, made[1])
            if best is not None:
                seconds, k, steps[k] = best
                steps[j], self.seconds[k] = Step(sub.structural_hash, "folded"), seconds
        return steps

    def _layout_seconds(self, j: int, side: str) -> float:
        """What layout step ``j`` costs apart from the kernel it would fold into on ``side`` (class docstring)."""
        seconds = self.seconds[j]
        assert seconds is not None
        if side != LOAD or not self.views[j]:
            return seconds
        sub = self.parts[j][0]
        if sub.structural_hash not in self.copies:
            task = replace(make_task(sub, seed=self.seed), key=sub.structural_hash)
            result = self._measure(task, sub, default_recipe(task.program, self.backend))
            self.copies[sub.structural_hash] = result.median_s if result.ok else 0.0
        return max(seconds, self.copies[sub.structural_hash])

    def _try(self, step: Step, k: int, folded: tuple[int, ...]) -> tuple[float, Step] | None:
        """The kernel step ``k`` with the layout steps ``folded`` and its time, or None when it fails anywhere."""
        assert step.recipe is not None
        try:
            merged = step_subgraph(self.graph, self.parts, k, folded)
            made = kernel_step(merged, step.recipe, self.backend, folded=folded, structural_hash=step.structural_hash)
            task = replace(make_task(merged, seed=self.seed, fold=True), key=merged.structural_hash)
        except (ScheduleError, EmbedError, ValueError):
            return None
        result = self._measure(task, merged, parse(step.recipe))
        return (result.median_s, made) if result.ok else None

    def _measure(self, task: Task, subgraph: Subgraph, recipe: Recipe) -> RunResult:
        """``recipe`` on ``task`` (of ``subgraph``), stored; what an earlier run stored is not measured again."""
        self.measurer.table.results.setdefault(task.key, {}).update(self.store.results(subgraph))
        return self.measurer.measure(task, task.key, [recipe])[0]


def _ties_as_kernels(steps: Sequence[Step], subgraphs: Sequence[Subgraph], chosen: Mapping[str, SubgraphReport],
                     kernels: _Kernels, margin: float) -> tuple[tuple[Step, ...], set[str]] | None:
    """The plan's steps with each eager step whose subgraph's kernel was measured faster than eager, but by no more
    than ``margin`` (a tie the margin gave to eager), run as that kernel, and those subgraphs; None when there is
    none. Apart, such a kernel cannot be told from noise; in the model it may save more than it did apart (a fused
    epilogue's pass over memory, a launch), so the whole model, timed both ways, decides (``choose_runtime``)."""
    tied: set[str] = set()
    out = []
    for subgraph, step in zip(subgraphs, steps, strict=True):
        row = chosen[subgraph.structural_hash]
        if step.impl == "eager" and row.choice == "eager" and row.recipe is not None and row.kernel_s is not None \
                and row.eager_s is not None and row.kernel_s < row.eager_s <= row.kernel_s * (1 + margin):
            kernel = kernels.step(subgraph, row.recipe)
            if kernel is not None:
                step = kernel
                tied.add(subgraph.structural_hash)
        out.append(step)
    return (tuple(out), tied) if tied else None


def _step_seconds(row: SubgraphReport) -> float | None:
    """What the chosen implementation of ``row`` was timed at (None: not timed)."""
    seconds = row.kernel_s if row.choice == "kernel" else row.eager_s
    return seconds if seconds is not None and math.isfinite(seconds) else None


class _Search:
    """The promoted encoder and the persistent index, opened on first use (never when every subgraph is a hit), and
    the devices of this one's class that may lend a neighbour their recipes (``lenders``)."""

    def __init__(self, ctx: Context, device_id: int, stages: _Stages) -> None:
        self.ctx, self.device_id, self.stages = ctx, device_id, stages
        self.opened = False
        self.encoder: Encoder | None = None
        self.index: VectorIndex | None = None
        self.lenders: list[int] = []

    def open(self) -> None:
        if self.opened:
            return
        started = time.perf_counter()
        self.opened = True
        with self.ctx.database.scope() as session:
            sources = profile_sources(session, self.device_id)
        self.lenders = sources[1:]
        self.encoder = _promoted_encoder(self.ctx, sources)
        if self.encoder is not None:
            key = IndexKey(self.ctx.device.device_class, self.encoder.name, self.encoder.version)
            self.index = VectorIndex.open(self.ctx.database, key, self.ctx.index_dir, self.ctx.index_config)
        self.stages.add("index", started)


def _promoted_encoder(ctx: Context, sources: Sequence[int]) -> Encoder | None:
    """The first encoder of :data:`ENCODER_PREFERENCE` with a promoted version; else ``static`` fitted on the
    profiled subgraphs of the first device of ``sources`` (this device, then the others of its class:
    ``profile_sources``) that has at least 2, saved, promoted and used to embed them; None when none has."""
    for name in ENCODER_PREFERENCE:
        if ctx.encoders.promoted(name):
            return ctx.encoders.load(name)
    with ctx.database.scope() as session:
        profiled = ((device, ids) for device in sources if len(ids := profiled_subgraphs(session, device)) >= 2)
        device_id, ids = next(profiled, (None, []))
        if device_id is None:
            return None
        fitted = fit_encoder(session, "static", device_id=device_id, subgraph_ids=ids, backend=ctx.backend)
        embed_subgraphs(session, fitted, device_id=device_id, subgraph_ids=ids)
    ctx.encoders.save(fitted)
    ctx.encoders.promote("static", fitted.version)
    return fitted


#: A subgraph whose eager time is under this fraction of its roofline bound is not measured: eager moves no data there
#: (a view), and no kernel, which must move it, can come near (``_under_bound``).
BOUND_FRACTION = 0.5


def _under_bound(task: Task, row: SubgraphReport, eager_s: float, device: DeviceSpec) -> bool:
    """Whether eager runs the subgraph in under :data:`BOUND_FRACTION` of the fewest seconds any kernel can take
    (``embed.profile.roofline_bound``): then it is chosen with nothing measured, and ``row`` says why."""
    bound = roofline_bound(static_features(task.program), device)
    if not eager_s < BOUND_FRACTION * bound:  # NaN: eager cannot run it
        return False
    row.source, row.eager_s = "bound", eager_s
    row.reason = (f"eager takes {eager_s * 1e6:.3g} us, under half the {bound * 1e6:.3g} us any kernel needs to move "
                  "its data: nothing measured")
    row.choose(0.0)
    return True


def _look_up(subgraph: Subgraph, row: SubgraphReport, ctx: Context, store: MeasurementStore, kernels: _Kernels,
             config: OptimizeConfig) -> dict[str, float | str] | None:
    """A hit (the database holds the subgraph's best recipe, which still generates a kernel here, and its eager
    time) fills ``row`` and gives None; otherwise the subgraph's stored measurements (what an interrupted run
    measured)."""
    subgraph_id, device_id = store.ids[subgraph.structural_hash], store.device_id
    with ctx.database.scope() as session:
        best = best_recipes(session, device_id=device_id, subgraph_ids=[subgraph_id], toolchain=ctx.toolchain)
        eager = eager_times(session, device_id=device_id, toolchain=ctx.toolchain, subgraph_ids=[subgraph_id])
        stored = stored_results(session, subgraph_id=subgraph_id, device_id=device_id, toolchain=ctx.toolchain)
    if subgraph_id in best and subgraph_id in eager and kernels.step(subgraph, best[subgraph_id].recipe):
        row.source, row.recipe, row.kernel_s = "hit", best[subgraph_id].recipe, best[subgraph_id].median_s
        row.eager_s = eager[subgraph_id]
        row.candidates = [{"recipe": row.recipe, "origin": "stored", "seconds": row.kernel_s, "error": None,
                           "message": None}]
        row.choose(config.margin)
        return None
    return stored


#: A convolution cuDNN runs in this many seconds or more (as eager times it) tries no generated kernel but its default
#: recipe: over the 101 distinct convolutions of the s15-s23 H200 rows (``bench/README.md``, twenty-fourth session)
#: no other generated kernel won one at 10 us or more, the best of them 1.28-34x cuDNN's time, each one a compile and
#: a slow call; under it (a squeeze-excitation's 1x1 convolution of pooled pixels, 7 us) one fused kernel beat the
#: library's convolution and epilogue launches 3x.
LIBRARY_CONVOLUTION_S = 10e-6


def _candidates_wanted(task: Task, row: SubgraphReport, share: float, eager_s: float, backend: str,
                       config: OptimizeConfig) -> int:
    """How many candidates a subgraph tries beside its default recipe and the library calls
    (``service.transfer.candidates``' ``wanted``): none for a convolution cuDNN runs in
    :data:`LIBRARY_CONVOLUTION_S` or more, its nearest neighbour's recipe only for a subgraph under
    ``config.minor_share`` of the model's eager time (it can gain the model no more than that share; over the
    s15-s23 rows at most 0.13% of a model was lost, 21% of the trials saved together with the convolutions' rule),
    else ``config.k``. ``row.reason`` says why where fewer."""
    if backend == "cuda" and eager_s >= LIBRARY_CONVOLUTION_S and match_convolution(task.program) is not None:
        row.reason = f"a convolution cuDNN runs in {eager_s * 1e6:.3g} us: its default recipe and cuDNN only"
        return 0
    if share < config.minor_share:
        row.reason = f"{share:.1%} of the model's eager time: its default recipe, the library calls and one neighbour's"
        return 1
    return config.k


#: cuBLASLt's heuristic ranks a contraction tries on cuda: the first three of the plain call, the first of the batched
#: one. Over the 20,237 trials of the s15-s25 H200 rows the other ranks (3-5 plain, 1-2 batched) took 913 and never
#: gave the fastest candidate (``bench/README.md``, twenty-sixth session).
LT_RANKS_TRIED = {False: 3, True: 1}


def _left_out(recipe: Recipe, space: RecipeSpace) -> bool:
    """Whether optimize leaves ``recipe`` untried, with nothing in its place: a generated CUDA-core GEMM
    (``gemm(simt,...)``) of a contraction cuBLASLt runs (its space's default; over the 1,773 GEMM subgraphs of the
    s15-s25 H200 rows, 4,323 of their trials, one was the fastest candidate twice, both times at twice eager's time,
    ``bench/README.md``, twenty-fifth session), or a cuBLASLt algorithm past :data:`LT_RANKS_TRIED`."""
    gemm = _gemm_step(recipe)
    if gemm is None:
        return False
    path = str(gemm.args[0])
    if path == "simt":
        default = _gemm_step(space.default)
        return default is not None and str(default.args[0]) == "cublaslt"
    if path == "cublaslt":
        batched = str(gemm.args[-1]) == "batched"
        return int(gemm.args[1]) >= LT_RANKS_TRIED[batched]
    return False


def _gemm_step(recipe: Recipe) -> RecipeStep | None:
    return next((step for step in recipe.steps if step.name == "gemm" and step.args), None)


@dataclass
class _Lookup:
    """A subgraph to transfer: its neighbours (and the names of the devices that lent their recipes), its embedding,
    and the candidates it tries (``service.transfer.candidates``) in the recipe space they come from."""

    subgraph_id: int
    near: list[Neighbour]
    lenders: dict[int, str]
    encoder: Encoder | None
    vector: Any
    space: RecipeSpace
    candidates: dict[Recipe, str]


def _neighbours(subgraph: Subgraph, task: Task, ctx: Context, store: MeasurementStore, measurer: Measurer,
                search: _Search, config: OptimizeConfig, stages: _Stages, wanted: int) -> _Lookup:
    """Look up ``subgraph``'s nearest neighbours and make its candidates: done for every subgraph before any is
    measured, so that all their kernels compile ahead (``transforms.build.Ahead``) while the first ones run."""
    h = subgraph.structural_hash
    search.open()
    started = time.perf_counter()
    near: list[Neighbour] = []
    names: dict[int, str] = {}
    vector = None
    if search.encoder is not None and search.index is not None:
        vector = search.encoder.encode(_features(search.encoder, task, subgraph, measurer, ctx))[0]
        with ctx.database.scope() as session:
            near = neighbours(session, search.index, vector, task=task, device_id=store.device_id, k=config.k,
                              backend=ctx.backend, exclude={h}, lenders=search.lenders)
            lent = {n.lent_by for n in near} - {None}
            if lent:  # another device of the class lent recipes: the report names it
                names = dict(session.execute(select(Device.id, Device.name).where(Device.id.in_(lent))).tuples().all())
    space = RecipeSpace(task.program, ctx.backend)
    tried = {recipe: origin for recipe, origin in candidates(space, near, wanted=wanted, seed=config.seed,
                                                             fill=config.fill, library=True, explore=config.explore)
             .items() if not _left_out(recipe, space)}
    stages.add("neighbours", started)
    return _Lookup(store.ids[h], near, names, search.encoder, vector, space, tried)


def _transfer(task: Task, row: SubgraphReport, found: _Lookup, ctx: Context, store: MeasurementStore,
              measurer: Measurer, config: OptimizeConfig, stages: _Stages) -> None:
    h, near, encoder, vector = row.structural_hash, found.near, found.encoder, found.vector
    subgraph_id, device_id = found.subgraph_id, store.device_id
    row.source = "transfer"
    started = time.perf_counter()
    result = measure_candidates(task, h, near, found.candidates, measurer=measurer, space=found.space,
                                seed=config.seed)
    eager_s = measurer.eager(task, h)
    stages.add("measure", started)
    row.neighbours = [{"structural_hash": n.structural_hash, "distance": n.distance, "recipe": n.recipe,
                       "lent_by": found.lenders.get(n.lent_by)} for n in near]
    row.candidates = [{"recipe": t.recipe, "origin": t.origin, "seconds": t.result.median_s if t.result.ok else None,
                       "error": None if t.result.ok else t.result.error_kind,
                       "message": None if t.result.ok else t.result.error} for t in result.tried]
    # the fastest of this run's candidates and of what earlier runs stored for the subgraph: what a hit would take
    measured = {recipe: s for recipe, s in measurer.table.results.get(h, {}).items() if not isinstance(s, str)}
    if measured:
        row.recipe = min(measured, key=measured.__getitem__)
        row.kernel_s = measured[row.recipe]
    row.eager_s = eager_s if math.isfinite(eager_s) else None
    row.choose(config.margin)
    nearest = min((n.distance for n in near), default=None)
    row.queued = nearest is None or nearest > config.far_distance
    store.baseline(task, result.default_s, eager_s)
    with ctx.database.scope() as session:
        if math.isfinite(result.default_s) and encoder is not None and vector is not None:
            add_embeddings(session, [EmbeddingIn(subgraph_id, device_id, encoder.name, encoder.version, vector)])
        if row.queued:
            request_crawl(session, subgraph_id=subgraph_id, device_id=device_id, distance=nearest)


def _features(encoder: Encoder, task: Task, subgraph: Subgraph, measurer: Measurer, ctx: Context) -> FeatureSet:
    static = static_vector(subgraph)[None, :]
    if not encoder.uses_profile:
        return FeatureSet(static)
    from service.crawl import baseline

    base = baseline(task, subgraph.structural_hash, measurer, ctx.backend)
    return FeatureSet(static, profile_vector(task, subgraph, base, ctx.device)[None, :])


def optimize_job(params: dict[str, Any], progress: Any) -> dict[str, Any]:
    """The ``optimize`` job kind (``service.jobs``). ``params``: ``model`` (``zoo:NAME`` or the path of an ``.onnx``
    or ``.json`` file the worker can read), ``backend`` (default ``auto``), ``k``, ``margin``, ``index_factory``,
    ``index_metric``. The result: the report, and the plan file written under the data dir's ``plans/``."""
    from db.index.vector_index import Metric
    from embed.importers import load_model
    from service.devices import detect_device, toolchain
    from service.weights import encode_weights, model_weights
    from transforms.backends import resolve_backend
    from transforms.plan import save_plan

    backend = resolve_backend(str(params.get("backend", "auto")))
    jobs = progress.context
    ctx = Context(jobs.database, detect_device(backend), toolchain(backend), backend, jobs.data_dir / "kernels",
                  jobs.index_dir, IndexConfig(str(params.get("index_factory", "Flat")),
                                              Metric(str(params.get("index_metric", "l2")))),
                  EncoderStore(jobs.data_dir / "encoders"))
    spec = str(params["model"])
    graph = load_model(spec)
    device = torch.device("cuda" if backend == "cuda" else "cpu")
    weights = model_weights(spec, graph)
    config = OptimizeConfig(k=int(params.get("k", 5)), margin=float(params.get("margin", 0.05)),
                            compare_compile=False)
    with Worker() as worker:
        result = optimize(graph, ctx, worker=worker, config=config, name=spec,
                          params={n: t.to(device) for n, t in weights.items()} if weights is not None else None,
                          progress=lambda done, total, what: progress(done / max(total, 1), what))
    path = jobs.data_dir / "plans" / f"job-{progress.job_id}.tbplan"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_plan(result.plan, path, encode_weights(result.params) if result.params is not None else None)
    return {"report": result.report.to_json(), "plan": str(path)}
