"""A whole crawl, resumable: pick the subgraphs (open demand first, then zoo models, then ONNX files in folders),
tune the ones not yet crawled on this device and toolchain, run the cross table, then retrain the learned encoder
when enough new data arrived (``service.crawl_encoder``) and refit the cost model that ranks transfer's fill on every
measurement of the device and toolchain (``service.cost_model.cost_model_step``).

    result = run_crawl(database, CrawlParams(models=("lm_head",), backend="cpu", budget=8), measurer,
                       store=EncoderStore(dir), progress=progress)

Every measurement and eager time is stored as soon as it is taken (with the job's id), and the measurer starts
from what the database holds, so a restarted crawl replays the searches it interrupted without running a kernel
twice. A subgraph's profile, its demand rows and the crawl's checkpoint commit in one transaction, and the
checkpoint fixes the crawl's subgraphs and the best recipes the cross table applies: a crawl killed at any point
and restarted ends with the database an uninterrupted one would have left.

Sharded (``shards`` other than 1, what ``tunebank crawl --queue`` does): the crawl job plans as above, then splits the
subgraphs to tune into ``crawl_shard`` child jobs (queued with the checkpoint that names them), which the workers of
its queue run in parallel, each resumable from its own checkpoint, while the crawl job runs the ones it can claim and
waits for the rest. Only once every shard has succeeded does it run the cross table and the encoder step, alone: the
crawl job holds the crawl lock throughout, so whole crawls still never overlap. Shards record their measurements
under the crawl job's id, so the database ends as after the same crawl unsharded.
"""

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from db.models import Baseline, Demand, Embedding, Measurement, Recipe
from db.models import Subgraph as SubgraphRow
from db.repositories._insert import insert_ignore_count
from db.repositories.jobs import JobStatus
from db.repositories.measurements import MeasurementIn, ingest_measurements
from db.repositories.model_catalog import add_model
from db.repositories.rankings import best_recipes
from db.session import Database
from embed import zoo
from embed.errors import EmbedError
from embed.importers import load_model
from embed.ir import Graph, graph_from_json
from embed.partition import partition
from embed.subgraph import Subgraph, SubgraphKind
from service.cost_model import CostModelStore, cost_model_step
from service.crawl import baseline, cross_recipes, profile_vector, tune_one
from service.crawl_encoder import encoder_step
from service.embeddings import EncoderStore
from service.jobs import JobContext, JobProgress
from service.measure import Measurer
from service.store import PROFILE_ENCODER, add_profiles, add_subgraphs, register_device
from transforms.plan import content_hash
from transforms.recipe import Recipe as RecipeSteps
from transforms.recipe import parse
from transforms.results import RunResult
from transforms.tune import Task, make_task

log = logging.getLogger(__name__)

#: Fractions of a crawl's progress at which its phases start.
TUNE, CROSS, ENCODER = 0.0, 0.85, 0.95
SHARD_KIND = "crawl_shard"  # the job kind of a shard (``crawl_shard_job``)
SHARD_SUBGRAPHS = 8  # subgraphs to tune per shard when the number of shards is automatic (``shards=0``)


class ShardFailedError(RuntimeError):
    """A shard of the crawl failed (out of attempts, or an error): the crawl stops before its cross table."""


@dataclass(frozen=True)
class CrawlParams:
    """What a crawl tunes and how; a job's params (``to_params`` / ``from_params`` round-trip)."""

    models: tuple[str, ...] = ()  # zoo names or family aliases
    families: tuple[str, ...] = ()  # zoo families ("all": every one), at ``sizes``
    sizes: str = "default"  # default (each family's default member) | grid (every member) | N (first N members)
    onnx_dirs: tuple[str, ...] = ()  # folders searched for *.onnx
    demand: bool = True  # the subgraphs optimize queued because their nearest neighbour was far
    backend: str = "cpu"
    strategy: str = "evolutionary"
    budget: int = 32
    seed: int = 0
    cross: bool = True
    retrain_min: int = 8  # new profiled subgraphs since the last training that trigger a new learned encoder
    shards: int = 1  # jobs that tune the subgraphs: 1, the crawl job; N, N shard jobs; 0, one per SHARD_SUBGRAPHS

    def to_params(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "CrawlParams":
        known = {f.name for f in fields(cls)}
        unknown = set(params) - known
        if unknown:
            raise ValueError(f"unknown crawl parameter(s): {', '.join(sorted(unknown))}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in params.items()})


def zoo_names(params: CrawlParams) -> list[str]:
    """The zoo models a crawl covers, in order, without repeats."""
    families = zoo.families() if "all" in params.families else list(params.families)
    names = list(params.models)
    for name in families:
        members = zoo.FAMILIES.get(name).members()
        if params.sizes == "default":
            names.append(name)
        elif params.sizes == "grid":
            names.extend(members)
        elif params.sizes.isdigit():
            names.extend(members[: int(params.sizes)])
        else:
            raise ValueError(f"bad sizes {params.sizes!r}; use default, grid or a number of grid members")
    return list(dict.fromkeys(names))


def onnx_files(folders: Sequence[str]) -> list[Path]:
    return sorted({p for folder in folders for p in Path(folder).expanduser().rglob("*.onnx") if p.is_file()})


def model_graphs(params: CrawlParams) -> tuple[list[Graph], dict[str, str]]:
    """The crawl's zoo models and ONNX files as graphs, and the files that could not be imported (with why)."""
    graphs = [load_model(f"zoo:{n}") for n in zoo_names(params)]
    refused: dict[str, str] = {}
    for path in onnx_files(params.onnx_dirs):
        try:
            graphs.append(load_model(str(path)))
        except (EmbedError, OSError, ValueError) as e:
            refused[str(path)] = str(e).splitlines()[0]
            log.warning("crawl: skipping %s: %s", path, refused[str(path)])
    return graphs, refused


def split(todo: Sequence[str], shards: int) -> list[list[str]]:
    """``todo`` in consecutive parts of near-equal size (a model's subgraphs stay together): ``shards`` of them, or
    one per ``SHARD_SUBGRAPHS`` when ``shards`` is 0; no empty part."""
    n = max(1, min(len(todo), shards if shards > 0 else math.ceil(len(todo) / SHARD_SUBGRAPHS)))
    return [list(todo[i * len(todo) // n: (i + 1) * len(todo) // n]) for i in range(n)] if todo else []


def stored_subgraph(row: SubgraphRow) -> Subgraph:
    """A subgraph as the database holds it (canonical IR, kind and hashes)."""
    return Subgraph(graph_from_json(row.ir_json), SubgraphKind(row.kind), row.structural_hash, row.family_hash, (), ())


def _open_demand(session: Session, device_id: int) -> list[int]:
    query = (select(Demand.subgraph_id).where(Demand.device_id == device_id, Demand.status == "open")
             .order_by(Demand.requests.desc(), Demand.id))
    return list(dict.fromkeys(session.scalars(query)))


def _crawled(session: Session, device_id: int, toolchain: str, ids: Sequence[int]) -> set[int]:
    """Subgraphs with a profile on the device and an eager baseline for the toolchain: crawled before."""
    profiled = select(Embedding.subgraph_id).where(Embedding.device_id == device_id,
                                                   Embedding.encoder == PROFILE_ENCODER)
    query = select(Baseline.subgraph_id).where(Baseline.device_id == device_id, Baseline.toolchain == toolchain,
                                               Baseline.subgraph_id.in_(list(ids)), Baseline.subgraph_id.in_(profiled))
    return set(session.scalars(query))


class Crawl:
    """One crawl's state: its device, measurer (stored as it measures), subgraphs and checkpoint."""

    def __init__(self, database: Database, params: CrawlParams, measurer: Measurer, *, store: EncoderStore | None,
                 progress: JobProgress, crawl_id: int | None = None, cost_models: CostModelStore | None = None) -> None:
        self.database, self.params, self.store, self.progress = database, params, store, progress
        self.cost_models = cost_models
        self.crawl_id = progress.job_id if crawl_id is None else crawl_id  # the job measurements are recorded under
        self.device, self.toolchain = measurer.table.device, measurer.table.toolchain
        self.inner = measurer
        self.measurer = Measurer(type(measurer.table)(self.device, self.toolchain), run=self._run,
                                 eager_time=self._eager)
        self.checkpoint = dict(progress.checkpoint)

    # measurements go to the database as they are taken
    def _run(self, task: Task, recipes: list[RecipeSteps]) -> list[RunResult]:
        assert self.inner.run is not None, "a crawl needs a measurer that can run kernels"
        results = self.inner.run(task, recipes)
        records = [MeasurementIn(task.key, str(r), self.device.name, self.toolchain, m.median_s if m.ok else None,
                                 m.iqr_s if m.ok else None, m.repeats, m.ok, m.error_kind if not m.ok else None,
                                 job_id=self.crawl_id) for r, m in zip(recipes, results, strict=True)]
        with self.database.scope() as session:
            ingest_measurements(session, records)
        return results

    def _eager(self, task: Task) -> float:
        assert self.inner.eager_time is not None, "a crawl needs a measurer that can run eager PyTorch"
        seconds = self.inner.eager_time(task)
        with self.database.scope() as session:
            insert_ignore_count(session, Baseline.__table__, ["subgraph_id", "device_id", "toolchain"],
                                ["subgraph_id", "device_id", "toolchain", "eager_s"],
                                [(self.ids[task.key], self.device_id, self.toolchain,
                                  seconds if math.isfinite(seconds) else None)])
        return seconds

    def _preload(self, session: Session) -> None:
        """What the database already holds for the crawl's subgraphs on this device and toolchain."""
        by_id = {i: h for h, i in self.ids.items()}
        for page in _pages(list(by_id)):
            rows = session.execute(
                select(Measurement.subgraph_id, Recipe.canonical, Measurement.ok, Measurement.median_s,
                       Measurement.error_kind).join(Recipe, Recipe.id == Measurement.recipe_id)
                .where(Measurement.device_id == self.device_id, Measurement.toolchain == self.toolchain,
                       Measurement.subgraph_id.in_(page)))
            for sid, recipe, ok, median, error in rows:
                self.measurer.table.results.setdefault(by_id[sid], {})[recipe] = median if ok else str(error)
            eager = session.execute(select(Baseline.subgraph_id, Baseline.eager_s).where(
                Baseline.device_id == self.device_id, Baseline.toolchain == self.toolchain,
                Baseline.subgraph_id.in_(page)))
            self.measurer.table.eager.update((by_id[sid], seconds) for sid, seconds in eager)

    def _plan(self) -> None:
        """Store the crawl's subgraphs and fix them (and which need tuning) in the checkpoint."""
        graphs, refused = model_graphs(self.params)
        parts = [[s for s in partition(g) if s.tunable] for g in graphs]
        found = [s for p in parts for s in p]
        with self.database.scope() as session:
            self.device_id = register_device(session, self.device)
            ids = add_subgraphs(session, found)
            for graph, subgraphs in zip(graphs, parts, strict=True):  # the catalog: which models the crawl saw
                add_model(session, name=graph.name[:200], content_hash=content_hash(graph),
                          subgraph_hashes=[s.structural_hash for s in subgraphs])
            demand = _open_demand(session, self.device_id) if self.params.demand else []
            rows = {r.id: r for r in session.scalars(select(SubgraphRow).where(SubgraphRow.id.in_(demand)))}
            hashes = list(dict.fromkeys([rows[i].structural_hash for i in demand] + [s.structural_hash for s in found]))
            ids.update((rows[i].structural_hash, i) for i in demand)
            done = _crawled(session, self.device_id, self.toolchain, [ids[h] for h in hashes]) - set(demand)
            todo = [h for h in hashes if ids[h] not in done]
            self.checkpoint = {"subgraphs": hashes, "todo": todo, "next": 0, "models": len(graphs),
                               "refused": refused}
            self.progress.save(self.checkpoint, session)

    def _load(self) -> None:
        hashes = self.checkpoint["subgraphs"]
        with self.database.scope() as session:
            self.device_id = register_device(session, self.device)
            rows = list(session.scalars(select(SubgraphRow).where(SubgraphRow.structural_hash.in_(hashes))))
            self.ids = {r.structural_hash: r.id for r in rows}
            self.subgraphs = {r.structural_hash: stored_subgraph(r) for r in rows}
            self._preload(session)

    def task(self, key: str) -> Task:
        """A fresh task (its problem's inputs are not kept once the subgraph is done)."""
        return replace(make_task(self.subgraphs[key], seed=self.params.seed), key=key)

    def tune(self) -> None:
        todo = self.checkpoint["todo"]
        for n in range(self.checkpoint["next"], len(todo)):
            key = todo[n]
            self.progress(TUNE + (CROSS - TUNE) * n / max(len(todo), 1), f"tune {n + 1}/{len(todo)}")
            task, backend = self.task(key), self.params.backend
            base = baseline(task, key, self.measurer, backend)
            tune_one(task, key, self.measurer, backend=backend, strategy=self.params.strategy,
                     budget=self.params.budget, seed=self.params.seed)
            vector = profile_vector(task, self.subgraphs[key], base, self.device)
            with self.database.scope() as session:
                add_profiles(session, self.device_id, {self.ids[key]: vector})
                session.execute(update(Demand).where(Demand.subgraph_id == self.ids[key],
                                                     Demand.device_id == self.device_id).values(status="crawled"))
                self.checkpoint = {**self.checkpoint, "next": n + 1}
                self.progress.save(self.checkpoint, session)

    def tune_in_shards(self) -> None:
        """Tune the subgraphs in shard jobs run by the workers of this job's queue (this one included), then load
        what they measured; raises ``ShardFailedError`` when one failed."""
        if "shards" not in self.checkpoint:
            shard = {"crawl": self.progress.job_id, "params": self.params.to_params()}
            with self.database.scope() as session:
                ids = [self.progress.spawn(session, SHARD_KIND, {**shard, "subgraphs": part})
                       for part in split(self.checkpoint["todo"], self.params.shards)]
                self.checkpoint = {**self.checkpoint, "shards": ids}
                self.progress.save(self.checkpoint, session)
        ids = self.checkpoint["shards"]
        done = self.progress.join(ids, report=lambda n, total: self.progress(
            TUNE + (CROSS - TUNE) * n / max(total, 1), f"tune: {n}/{total} shards done"))
        failed = [j for j in done if j.status != JobStatus.SUCCEEDED]
        if failed:
            raise ShardFailedError(
                f"crawl shard job(s) {', '.join(str(j.id) for j in failed)} {failed[0].status}: {failed[0].error}; "
                "what they measured is stored: run the crawl again to go on")
        with self.database.scope() as session:
            self._preload(session)  # what the shards measured, so that the cross table does not measure it again

    def bests(self) -> dict[str, str]:
        """Best recipe of each crawled subgraph, fixed once tuning ends (the cross table's sources)."""
        if "best" not in self.checkpoint:
            with self.database.scope() as session:
                best = best_recipes(session, device_id=self.device_id, subgraph_ids=list(self.ids.values()),
                                    toolchain=self.toolchain)
                by_id = {i: h for h, i in self.ids.items()}
                self.checkpoint = {**self.checkpoint, "best": {by_id[i]: t.recipe for i, t in sorted(best.items())}}
                self.progress.save(self.checkpoint, session)
        return self.checkpoint["best"]

    def cross(self) -> int:
        """Each subgraph with the best recipes of the same-kind ones, where one of the two is newly tuned."""
        best, keys, tuned = self.bests(), self.checkpoint["subgraphs"], set(self.checkpoint["todo"])
        applied = 0
        for n, key in enumerate(keys):
            self.progress(CROSS + (ENCODER - CROSS) * n / max(len(keys), 1), f"cross {n + 1}/{len(keys)}")
            kind = self.subgraphs[key].kind
            sources = {h: r for h, r in best.items()
                       if h != key and self.subgraphs[h].kind == kind and (key in tuned or h in tuned)}
            if not sources:
                continue
            task = self.task(key)
            recipes = sorted(set(cross_recipes(task.program, self.params.backend, sources).values()))
            self.measurer.measure(task, key, [parse(r) for r in recipes])
            applied += len(recipes)
        return applied

    def run(self) -> dict[str, Any]:
        if "subgraphs" not in self.checkpoint:
            self.progress(0.0, "loading models")
            self._plan()
        self._load()
        if self.params.shards == 1:
            self.tune()
        else:
            self.tune_in_shards()
        applied = self.cross() if self.params.cross else 0
        self.progress(ENCODER, "encoder")
        assert self.store is not None, "a crawl's encoder step needs an encoder store"
        encoder = encoder_step(self.database, self.store, device_id=self.device_id, backend=self.params.backend,
                               retrain_min=self.params.retrain_min, seed=self.params.seed, progress=self.progress,
                               checkpoint=self.checkpoint)
        cost_model = self.refit_cost_model()
        self.progress(1.0, "done")
        with self.database.scope() as session:
            measured = session.scalar(select(func.count()).select_from(Measurement)
                                      .where(Measurement.job_id == self.progress.job_id))
        planned, todo = self.checkpoint["subgraphs"], self.checkpoint["todo"]
        sharded = {"shards": self.checkpoint["shards"]} if "shards" in self.checkpoint else {}
        return {"models": self.checkpoint["models"], "refused_files": self.checkpoint.get("refused", {}),
                "subgraphs": len(planned), "tuned": len(todo), "skipped": len(planned) - len(todo),
                "measured": int(measured or 0), "cross_applications": applied, "device": self.device.name,
                "toolchain": self.toolchain, "encoder": encoder, "cost_model": cost_model, **sharded}

    def refit_cost_model(self) -> dict[str, Any]:
        """The cost model refitted on every subgraph measured on this device and toolchain (a resumed crawl fits
        the same one again: the fit is a function of the stored measurements)."""
        assert self.store is not None, "the cost model is refitted by the crawl job, which has an encoder store"
        store = self.cost_models or CostModelStore(self.store.directory.parent / "cost_models")
        self.progress(ENCODER, "cost model")
        with self.database.scope() as session:
            ids = list(session.scalars(select(Measurement.subgraph_id).distinct().where(
                Measurement.device_id == self.device_id, Measurement.toolchain == self.toolchain)))
        try:
            return cost_model_step(self.database, store, device_id=self.device_id, device=self.device.name,
                                   toolchain=self.toolchain, subgraph_ids=sorted(ids), seed=self.params.seed)
        except ValueError as e:  # nothing measured
            return {"promote": False, "reason": str(e)}


def _pages(items: list[int], size: int = 1000) -> list[list[int]]:
    return [items[i: i + size] for i in range(0, len(items), size)]


def run_crawl(database: Database, params: CrawlParams, measurer: Measurer, *, store: EncoderStore,
              progress: JobProgress, cost_models: CostModelStore | None = None) -> dict[str, Any]:
    """Run (or resume, from ``progress.checkpoint``) one crawl; returns its summary. Cost models go to
    ``cost_models`` (default: ``cost_models`` beside the encoder store's folder)."""
    return Crawl(database, params, measurer, store=store, progress=progress, cost_models=cost_models).run()


def run_shard(database: Database, params: dict[str, Any], measurer: Measurer, *,
              progress: JobProgress) -> dict[str, Any]:
    """Run (or resume) one shard of a crawl: ``params`` as the crawl job spawned it (``crawl``: its id,
    ``params``: its ``CrawlParams``, ``subgraphs``: the structural hashes to tune); returns its summary."""
    crawl = Crawl(database, CrawlParams.from_params(params["params"]), measurer, store=None, progress=progress,
                  crawl_id=int(params["crawl"]))
    if "subgraphs" not in crawl.checkpoint:
        crawl.checkpoint = {"subgraphs": list(params["subgraphs"]), "todo": list(params["subgraphs"]), "next": 0}
    crawl._load()
    crawl.tune()
    progress(1.0, "done")
    return {"crawl": crawl.crawl_id, "tuned": len(crawl.checkpoint["todo"]), "worker": progress.owner}


@contextlib.contextmanager
def _live(params: CrawlParams, context: JobContext) -> Iterator[tuple[CrawlParams, Measurer]]:
    """``params`` with this machine's backend for "auto" (a submitted crawl), and a live measurer on it."""
    from service.devices import detect_device, toolchain
    from service.measure import MeasurementTable, live_measurer
    from transforms.backends import resolve_backend
    from transforms.run import Worker

    params = replace(params, backend=resolve_backend(params.backend))
    with Worker() as worker:
        table = MeasurementTable(detect_device(params.backend), toolchain(params.backend))
        yield params, live_measurer(table, backend=params.backend, cache_dir=context.data_dir / "kernels",
                                    worker=worker)


def crawl_job(params: dict[str, Any], progress: JobProgress) -> dict[str, Any]:
    """The ``crawl`` job kind: a crawl on this machine's device with a live measurer."""
    context = progress.context
    with _live(CrawlParams.from_params(params), context) as (crawl, measurer):
        return run_crawl(context.database, crawl, measurer, store=EncoderStore(context.data_dir / "encoders"),
                         progress=progress, cost_models=CostModelStore(context.data_dir / "cost_models"))


def crawl_shard_job(params: dict[str, Any], progress: JobProgress) -> dict[str, Any]:
    """The ``crawl_shard`` job kind: one shard of a crawl (``run_shard``) with a live measurer."""
    context = progress.context
    with _live(CrawlParams.from_params(params["params"]), context) as (crawl, measurer):
        return run_shard(context.database, {**params, "params": crawl.to_params()}, measurer, progress=progress)
