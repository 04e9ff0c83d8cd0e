"""Leave-one-model-out evaluation of transfer tuning (``tunebank bench transfer``).

Every distinct subgraph of every model is tuned once with a large budget (``budget`` recipes of ``strategy``:
the optimum's stand-in where the space is too big to enumerate) and the best recipes of same-kind subgraphs are
cross-applied to it. Then, for each held-out model, a fresh SQLite database holds only the *other* models'
subgraphs, their searches and their cross-applications; each encoder is fitted there, the training subgraphs
are embedded and indexed, and every held-out subgraph is transfer-tuned with k = 1, 3, 5, ... neighbours (never
itself: a held-out subgraph that another model also has is excluded from its own neighbours). The ``oracle``
(:data:`ORACLE`) takes, in place of an encoder's nearest, the neighbours whose recipes run fastest on it. The same
subgraph is also tried with the default recipe, eager PyTorch and the best of k random recipes (measured before
the folds, so that a run's bulk of kernels comes first).

The optimum of a subgraph is the fastest time measured on it by anything in the run. All numbers go through one
``Measurer``, so a run can be recorded and replayed exactly.
"""

import functools
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from db.index import IndexConfig, VectorIndex
from db.migrate import upgrade
from db.repositories.rankings import best_recipes
from db.session import Database
from embed.encoders import FeatureSet, encoders
from embed.importers import load_model
from embed.ir import Graph
from embed.partition import partition
from embed.subgraph import Subgraph
from service.crawl import baseline, best_of, cross_recipes, profile_vector, tune_one
from service.embeddings import embed_subgraphs, fit_encoder
from service.measure import Measurer
from service.store import add_measurements, add_profiles, add_subgraphs, register_device, static_vector
from service.transfer import Neighbour, neighbours, random_recipes, transfer_from
from transforms.adapt import adapt
from transforms.recipe import parse
from transforms.space import RecipeSpace, default_recipe
from transforms.tune import Task, make_task

Progress = Callable[[str], None]
#: Not an encoder: ranks a held-out subgraph's neighbours by how fast their stored best recipes run on it, as a
#: perfect encoder would. Without fill no encoder's transfer beats it; with fill it shows the headroom left to a
#: better neighbour ranking (the fill after the best neighbours is the same).
ORACLE = "oracle"


@dataclass(frozen=True)
class BenchConfig:
    models: tuple[str, ...]
    backend: str = "cpu"
    budget: int = 32
    ks: tuple[int, ...] = (1, 3, 5, 10)
    random_ks: tuple[int, ...] | None = None  # k values of the random baseline (default: ks)
    encoders: tuple[str, ...] = ("static", "static+profiled", "learned")
    held_out: tuple[str, ...] | None = None  # models to hold out (default: every model)
    strategy: str = "evolutionary"
    local_budget: int = 0
    per_neighbour: int = 1  # recipes each neighbour gives (its fastest)
    fill: bool = True  # variants, vendor-ranked and random recipes make up the candidates the neighbours did not give
    seed: int = 0
    encoder_seed: int | None = None  # seed of the trained encoders (default: seed); the measurements do not use it

    def __post_init__(self) -> None:
        if len(self.models) < 2:
            raise ValueError("leave-one-model-out needs at least 2 models")
        for name in self.encoders:
            if name != ORACLE:
                encoders.get(name)  # UnknownNameError lists the valid names
        if not self.ks or min(self.ks) < 1 or min(self.random_k) < 1:
            raise ValueError(f"k values must be >= 1, got {list(self.ks)} and {list(self.random_k)}")
        unknown = set(self.held_out or ()) - set(self.models)
        if unknown:
            raise ValueError(f"held-out models {sorted(unknown)} are not among --models")

    @property
    def random_k(self) -> tuple[int, ...]:
        return self.random_ks or self.ks

    @property
    def training_seed(self) -> int:
        return self.seed if self.encoder_seed is None else self.encoder_seed


@dataclass
class HeldOut:
    """One held-out subgraph in one fold; times in seconds."""

    model: str
    key: str
    kind: str
    name: str
    space_size: int
    exact_match: bool  # another model has the same subgraph (it is excluded from the neighbours)
    default_s: float
    eager_s: float
    optimum_s: float = math.inf
    search_s: float = math.inf  # best of the subgraph's own large-budget search
    searched: int = 0  # distinct recipes the search measured, the default included (space_size: all of them)
    transfer: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)  # encoder -> k -> outcome
    random: dict[int, float] = field(default_factory=dict)  # k -> best of default + k random recipes


def load_graph(spec: str) -> Graph:
    """A zoo model (``NAME`` or ``zoo:NAME``) or an ``.onnx`` file."""
    return load_model(spec if spec.startswith("zoo:") or spec.lower().endswith(".onnx") else f"zoo:{spec}")


class TransferBench:
    """One run of the harness over ``config`` with ``measurer``; ``run()`` returns the held-out outcomes."""

    def __init__(self, config: BenchConfig, measurer: Measurer, *, workdir: Path, progress: Progress | None = None):
        self.config, self.measurer, self.workdir = config, measurer, Path(workdir)
        self.progress = progress or (lambda message: None)
        self.backend = config.backend
        self.models: dict[str, list[str]] = {}
        self.subgraphs: dict[str, Subgraph] = {}
        self.tasks: dict[str, Task] = {}
        self.own: dict[str, list[tuple[str, Any]]] = {}
        self.best: dict[str, str] = {}
        self.cross: dict[str, dict[str, str]] = {}

    def run(self) -> list[HeldOut]:
        self._load()
        self._tune_all()
        held = [m for m in self.config.models if self.config.held_out is None or m in self.config.held_out]
        keys = list(dict.fromkeys(k for m in held for k in self.models[m]))
        picks = {}
        for n, key in enumerate(keys, 1):
            self.progress(f"random picks {n}/{len(keys)}")
            picks[key] = self._random_k(key)
        outcomes = [o for i, model in enumerate(held) for o in self._fold(i, model)]
        for o in outcomes:
            o.random = picks[o.key]
        for o in outcomes:
            ok = [v for v in self.measurer.table.results[o.key].values() if not isinstance(v, str)]
            o.optimum_s = min(ok, default=math.inf)
        return outcomes

    def _load(self) -> None:
        for spec in self.config.models:
            self.progress(f"loading {spec}")
            keys = []
            for s in partition(load_graph(spec)):
                if s.tunable and s.structural_hash not in keys:
                    keys.append(s.structural_hash)
                    self.subgraphs.setdefault(s.structural_hash, s)
            self.models[spec] = keys
        for key, s in self.subgraphs.items():
            self.tasks[key] = make_task(s, seed=self.config.seed, name=f"{s.graph.name} ({'+'.join(s.ops)})")

    def _tune_all(self) -> None:
        for n, (key, task) in enumerate(self.tasks.items(), 1):
            self.progress(f"tuning {n}/{len(self.tasks)}: {task.name[:60]}")
            baseline(task, key, self.measurer, self.backend)
            history = tune_one(task, key, self.measurer, backend=self.backend, strategy=self.config.strategy,
                               budget=self.config.budget, seed=self.config.seed)
            self.own[key] = [(str(r), m) for r, m in history]
            found = best_of(history)
            if found is not None:
                self.best[key] = str(found[0])
        for n, (key, task) in enumerate(self.tasks.items(), 1):
            self.progress(f"cross table {n}/{len(self.tasks)}")
            sources = {h: r for h, r in self.best.items() if h != key and self.tasks[h].kind == task.kind}
            self.cross[key] = cross_recipes(task.program, self.backend, sources)
            self.measurer.measure(task, key, [parse(r) for r in sorted(set(self.cross[key].values()))])

    def _training_db(self, fold: int, train: list[str]) -> tuple[Database, int, dict[str, int]]:
        database = Database(f"sqlite:///{self.workdir / f'fold{fold}.db'}")
        upgrade(database.engine)
        device = self.measurer.table.device
        with database.scope() as session:
            device_id = register_device(session, device)
            ids = add_subgraphs(session, [self.subgraphs[k] for k in train])
            profiles = {}
            for key in train:
                task = self.tasks[key]
                measured = dict(self.own[key])
                recipes = {r for b, r in self.cross[key].items() if b in ids}
                measured |= dict(zip(recipes, self.measurer.measure(task, key, [parse(r) for r in recipes]),
                                     strict=True))
                add_measurements(session, device, self.measurer.table.toolchain, key, measured.items())
                base = baseline(task, key, self.measurer, self.backend)
                profiles[ids[key]] = profile_vector(task, self.subgraphs[key], base, device)
            add_profiles(session, device_id, profiles)
        return database, device_id, ids

    def _fold(self, fold: int, model: str) -> list[HeldOut]:
        held = self.models[model]
        train = list(dict.fromkeys(k for m, keys in self.models.items() if m != model for k in keys))
        self.progress(f"fold {fold + 1}: holding out {model} ({len(held)} subgraphs, {len(train)} in the database)")
        database, device_id, ids = self._training_db(fold, train)
        outcomes = {key: self._held_out(model, key, key in ids) for key in held}
        try:
            for name in self.config.encoders:
                if name == ORACLE:
                    for key in held:
                        with database.scope() as session:
                            ranked = self._oracle_ranking(key, session, device_id, ids)
                        outcomes[key].transfer[name] = self._transfers(key, functools.partial(_first, ranked))
                    continue
                with database.scope() as session:
                    encoder = fit_encoder(session, name, device_id=device_id, subgraph_ids=list(ids.values()),
                                          backend=self.backend, seed=self.config.training_seed)
                    index_key = embed_subgraphs(session, encoder, device_id=device_id, subgraph_ids=list(ids.values()))
                index = VectorIndex.open(database, index_key, self.workdir / f"index{fold}", IndexConfig("Flat"))
                for key in held:
                    vector = encoder.encode(self._query_features(key, encoder.uses_profile))[0]
                    with database.scope() as session:
                        near = functools.partial(neighbours, session, index, vector, task=self.tasks[key],
                                                 device_id=device_id, backend=self.backend, exclude={key},
                                                 per_neighbour=self.config.per_neighbour)
                        outcomes[key].transfer[name] = self._transfers(key, near)
        finally:
            database.dispose()
        return list(outcomes.values())

    def _transfers(self, key: str, near: Callable[..., Sequence[Neighbour]]) -> dict[int, dict[str, Any]]:
        """Transfer-tune held-out subgraph ``key`` from ``near(k)`` for each k."""
        c = self.config
        return {k: _summary(transfer_from(self.tasks[key], key, near(k=k), measurer=self.measurer, backend=self.backend,
                                          wanted=k * c.per_neighbour, local_budget=c.local_budget, seed=c.seed,
                                          fill=c.fill))
                for k in c.ks}

    def _oracle_ranking(self, key: str, session: Session, device_id: int, ids: Mapping[str, int]) -> list[Neighbour]:
        """Every training subgraph of the held-out subgraph's kind (``ids``: key -> row id) with the best recipe the
        database holds for it, as ``neighbours`` gives them, fastest on the held-out subgraph first (each
        neighbour's distance is that time in seconds)."""
        task = self.tasks[key]
        rows = {i: h for h, i in ids.items() if h != key and self.tasks[h].kind == task.kind}
        stored = best_recipes(session, device_id=device_id, subgraph_ids=list(rows))
        adapted = {i: str(adapt(parse(t.recipe), task.program, self.backend)[0]) for i, t in stored.items()}
        adapted = {i: recipe for i, recipe in adapted.items() if recipe}
        times = self.measurer.measure(task, key, [parse(r) for r in adapted.values()])
        ranked = sorted(zip(adapted.items(), times, strict=True), key=lambda c: c[1].score)
        return [Neighbour(i, rows[i], result.score, stored[i].recipe, recipe, ()) for (i, recipe), result in ranked]

    def _held_out(self, model: str, key: str, exact: bool) -> HeldOut:
        task = self.tasks[key]
        base = baseline(task, key, self.measurer, self.backend)
        own = dict(self.own[key])
        return HeldOut(model, key, task.kind, task.name, RecipeSpace(task.program, self.backend).size(), exact,
                       base.default_s, base.eager_s, search_s=min((m.score for m in own.values()), default=math.inf),
                       searched=len(own))

    def _query_features(self, key: str, profiled: bool) -> FeatureSet:
        subgraph, task = self.subgraphs[key], self.tasks[key]
        static = static_vector(subgraph)
        if not profiled:
            return FeatureSet(static)
        base = baseline(task, key, self.measurer, self.backend)
        return FeatureSet(static, profile_vector(task, subgraph, base, self.measurer.table.device))

    def _random_k(self, key: str) -> dict[int, float]:
        """Best of the default recipe and the first k of ``max(random_k)`` uniform random recipes, per k."""
        task, ks = self.tasks[key], self.config.random_k
        picks = random_recipes(RecipeSpace(task.program, self.backend), max(ks), seed=self.config.seed)
        default = default_recipe(task.program, self.backend)
        scores = [r.score for r in self.measurer.measure(task, key, [default, *picks])]
        return {k: min(scores[: k + 1]) for k in ks}


def _first(items: Sequence[Neighbour], k: int) -> Sequence[Neighbour]:
    return items[:k]


def _summary(result: Any) -> dict[str, Any]:
    return {
        "s": result.winner_s, "evaluations": result.evaluations, "winner": result.winner,
        "neighbours": [{"distance": n.distance, "recipe": n.recipe, "changes": list(n.changes)}
                       for n in result.neighbours],
    }


def run_bench(config: BenchConfig, measurer: Measurer, *, workdir: Path | None = None,
              progress: Progress | None = None) -> list[HeldOut]:
    """Run the harness; databases and index files go to ``workdir`` (a temporary folder by default)."""
    if workdir is not None:
        return TransferBench(config, measurer, workdir=workdir, progress=progress).run()
    with tempfile.TemporaryDirectory(prefix="tunebank-bench-") as tmp:
        return TransferBench(config, measurer, workdir=Path(tmp), progress=progress).run()
