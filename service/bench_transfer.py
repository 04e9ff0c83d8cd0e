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

Splits (``split``): ``model`` holds out one model per fold (a subgraph another model also has stays in the database,
excluded only from its own neighbours); ``family`` holds out every model of a zoo family together, and no subgraph
any of them has is in the fold's database.

Fills (``fills``): the places the neighbours leave are left empty (``none``), filled with variants, vendor-ranked
and uniform random recipes (``random``), or with variants, vendor-ranked and the recipes a cost model fitted on the
fold's database ranks best (``model``, ``service.cost_model``) of a pool: :data:`~service.transfer.POOL` random
recipes (``fill_pool="space"``), or (``"recorded"``, so that a recording made without it replays) the uniform random
recipes the run measures anyway: the random baseline's picks and, when ``strategy`` is random, the subgraph's own
search.

The optimum of a subgraph is the fastest time measured on it by anything in the run (a replay: anything the
recording holds). With ``optimum="strong"`` each held-out subgraph's space is also searched: exhaustively where it
has fewer than ``exhaustive_below`` recipes, else by an evolutionary search of ``strong_budget`` new recipes (a
generation of 16 per batch) seeded with every recipe a transfer could take from the other subgraphs (the cross
table), its own search, the random picks and the vendor-ranked recipes. It runs before the folds and depends on none
of them, so one recording holds it for every split, encoder and fill. All numbers go through one ``Measurer``, so a
run can be recorded, resumed and replayed exactly; the strong optimum is paid once per device.

The measurements come in :data:`STAGES`, each depending only on the ones before, so a run can be measured in shards
(``Shard``: one process per GPU, ``tunebank bench transfer --devices N``), stage by stage, and the merged table
replays the whole run.
"""

import functools
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
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
from service.cost_model import CostModel, fit_cost_model
from service.crawl import baseline, best_of, cross_recipes, profile_vector, tune_one
from service.embeddings import embed_subgraphs, fit_encoder
from service.measure import Measurer
from service.store import add_measurements, add_profiles, add_subgraphs, register_device, static_vector
from service.transfer import Neighbour, neighbours, random_recipes, transfer_from
from transforms.adapt import adapt
from transforms.recipe import Recipe, parse
from transforms.search.evolutionary import Evolutionary
from transforms.search.strategy import search
from transforms.space import RecipeSpace, default_recipe
from transforms.tune import Task, make_task

Progress = Callable[[str], None]
#: Not an encoder: ranks a held-out subgraph's neighbours by how fast their stored best recipes run on it, as a
#: perfect encoder would. Without fill no encoder's transfer beats it; with fill it shows the headroom left to a
#: better neighbour ranking (the fill after the best neighbours is the same).
ORACLE = "oracle"
SPLITS = ("model", "family")
FILLS = ("none", "random", "model")
OPTIMA = ("recorded", "strong")
DATABASES = ("crawl", "strong")
FILL_POOLS = ("space", "recorded")
#: The run's measurements in the order they depend on each other: each subgraph's own search, random picks and
#: enumerated strong optimum; then the cross table (needs every subgraph's best) and the evolutionary strong optimum
#: (needs the cross table); then the folds' transfers (need all of it). A sharded run measures one stage at a time.
STAGES = ("subgraphs", "cross", "folds")


def family_of(spec: str) -> str:
    """The family of a model: ``bert_encoder`` of ``bert_encoder-h512-s128-b4`` (a zoo name) or of
    ``models/bert_encoder-h512-s128-b4.json`` (a file, by its name's part before the first ``-``)."""
    if spec.lower().endswith((".onnx", ".json")):
        return Path(spec).stem.partition("-")[0]
    return spec.removeprefix("zoo:").partition("-")[0]


def transfer_key(encoder: str, fill: str, config: "BenchConfig") -> str:
    """Key of ``HeldOut.transfer`` for an encoder with a fill: the encoder's name for the first fill of the run
    (what recordings made before fills were compared hold), ``ENCODER|FILL`` for the others."""
    return encoder if fill == config.fill_modes[0] else f"{encoder}|{fill}"


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
    split: str = "model"  # "model": leave one model out; "family": leave one zoo family out
    fills: tuple[str, ...] | None = None  # fills compared (none | random | model); default: random, or none w/o fill
    fill_pool: str = "space"  # what the cost model ranks: POOL random recipes, or the "recorded" random ones
    optimum: str = "recorded"  # "strong": exhaustive below exhaustive_below recipes, else evolutionary search
    exhaustive_below: int = 2000
    strong_budget: int = 256
    library: bool = False  # the vendor libraries' implementations (cuDNN's for a convolution) join every method's picks
    database: str = "crawl"  # what a fold's database holds of a subgraph: "crawl" (own search, cross table) | "strong"

    def __post_init__(self) -> None:
        if len(self.models) < 2:
            raise ValueError("leave-one-model-out needs at least 2 models")
        for value, allowed, what in ((self.split, SPLITS, "split"), (self.optimum, OPTIMA, "optimum"),
                                     (self.fill_pool, FILL_POOLS, "fill pool"), (self.database, DATABASES, "database"),
                                     *((f, FILLS, "fill") for f in self.fill_modes)):
            if value not in allowed:
                raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(allowed)}")
        if self.split == "family" and len({family_of(m) for m in self.models}) < 2:
            raise ValueError("leave-one-family-out needs models of at least 2 families")
        if self.database == "strong" and self.optimum != "strong":
            raise ValueError("--database strong stores each subgraph's strong-optimum search: it needs "
                             "--optimum strong")
        if self.strong_budget < 1 or self.exhaustive_below < 0:
            raise ValueError("the strong optimum needs --strong-budget >= 1 and --exhaustive-below >= 0")
        for name in self.encoders:
            if name != ORACLE:
                encoders.get(name)  # UnknownNameError lists the valid names
        if not self.ks or min(self.ks) < 1 or min(self.random_k) < 1:
            raise ValueError(f"k values must be >= 1, got {list(self.ks)} and {list(self.random_k)}")
        unknown = set(self.held_out or ()) - set(self.models)
        if unknown:
            raise ValueError(f"held-out models {sorted(unknown)} are not among --models")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "BenchConfig":
        """The config of ``dataclasses.asdict(config)`` after a JSON round trip (lists back to tuples)."""
        return cls(**{name: tuple(v) if isinstance(v, list) else v for name, v in data.items()})

    @property
    def random_k(self) -> tuple[int, ...]:
        return self.random_ks or self.ks

    @property
    def training_seed(self) -> int:
        return self.seed if self.encoder_seed is None else self.encoder_seed

    @property
    def fill_modes(self) -> tuple[str, ...]:
        return self.fills or (("random",) if self.fill else ("none",))


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
    transfer: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)  # transfer_key -> k -> outcome
    random: dict[int, float] = field(default_factory=dict)  # k -> best of default + k random recipes
    fold: str = ""  # the model (split "model") or family (split "family") held out
    recorded: int = 0  # distinct recipes measured on it in the whole run or recording (space_size: all of them)
    optimum_search: str = "recorded"  # "exhaustive" or "evolutionary" where the strong optimum searched it
    strong_searched: int = 0  # recipes the strong optimum's search proposed (those not measured before ran)
    library: int = 0  # vendor-library candidates measured beside each method's picks (config.library)


@dataclass(frozen=True)
class Shard:
    """Part ``index`` of ``count`` of stage ``stage``'s measurements: the stage's subgraphs (or folds) are dealt
    out by estimated cost, each to the part with the least so far (largest first), so the parts take about as long
    and every process computes the same deal."""

    stage: str
    index: int
    count: int

    def __post_init__(self) -> None:
        if self.stage not in STAGES or not 0 <= self.index < self.count:
            raise ValueError(f"a shard needs a stage of {', '.join(STAGES)} and 0 <= index < count, got {self}")

    def part(self, items: Sequence[Any], cost: Callable[[Any], int]) -> list[Any]:
        """This shard's items, in their given order."""
        loads, mine = [0] * self.count, set()
        for position in sorted(range(len(items)), key=lambda i: -cost(items[i])):
            lightest = loads.index(min(loads))
            loads[lightest] += cost(items[position])
            if lightest == self.index:
                mine.add(position)
        return [item for i, item in enumerate(items) if i in mine]


def load_graph(spec: str) -> Graph:
    """A zoo model (``NAME`` or ``zoo:NAME``), an ``.onnx`` file or an IR ``.json`` file."""
    is_file = spec.lower().endswith((".onnx", ".json"))
    return load_model(spec if spec.startswith("zoo:") or is_file else f"zoo:{spec}")


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
        self.picks: dict[str, dict[int, float]] = {}  # held-out key -> k -> best of default + k random recipes
        self.strong: dict[str, tuple[str, int]] = {}  # held-out key -> how its strong optimum searched, recipes
        self.strong_recipes: dict[str, list[str]] = {}  # held-out key -> every recipe its strong optimum measured

    def run(self, shard: Shard | None = None) -> list[HeldOut]:
        """Every stage's measurements (:data:`STAGES`), then the outcomes. With ``shard``, the stages before
        ``shard.stage`` are replayed from the table (where the other shards' measurements were merged), only the
        shard's part of its own stage is measured, and nothing is returned."""
        self._load()
        folds = self._folds()
        held = set(k for _, models in folds for m in models for k in self.models[m])
        c, last = self.config, STAGES.index(shard.stage) if shard else len(STAGES) - 1

        def part(stage: str, items: list[Any], cost: Callable[[Any], int]) -> list[Any]:
            return items if shard is None or shard.stage != stage else shard.part(items, cost)

        sizes = {key: RecipeSpace(task.program, self.backend).size() for key, task in self.tasks.items()}
        exhaustive = {key for key, size in sizes.items() if c.optimum == "strong" and key in held
                      and size < c.exhaustive_below}
        keys = part("subgraphs", list(self.tasks), lambda key: c.budget + (sizes[key] if key in exhaustive else 0))
        for n, key in enumerate(keys, 1):
            self.progress(f"subgraphs {n}/{len(keys)}: {self.tasks[key].name[:60]}")
            self._tune(key)
            if key in held:
                self.picks[key] = self._random_k(key)
            if key in exhaustive:
                self.strong[key] = self._strong(key)
        if last == 0:
            return []
        searched = {key for key in held if c.optimum == "strong" and key not in exhaustive}
        keys = part("cross", list(self.tasks), lambda key: 1 + (c.strong_budget if key in searched else 0))
        for n, key in enumerate(keys, 1):
            self.progress(f"cross table and strong optimum {n}/{len(keys)}: {self.tasks[key].name[:60]}")
            self._cross(key)
            if key in searched:
                self.strong[key] = self._strong(key)
        if last == 1:
            return []
        mine = part("folds", list(range(len(folds))), lambda i: len(folds[i][1]))
        outcomes = [o for i in mine for o in self._fold(i, *folds[i])]
        if shard is not None:
            return []
        for o in outcomes:
            o.random = self.picks[o.key]
            o.optimum_search, o.strong_searched = self.strong.get(o.key, ("recorded", 0))
            recorded = self.measurer.table.results[o.key]
            ok = [v for v in recorded.values() if not isinstance(v, str)]
            o.optimum_s, o.recorded = min(ok, default=math.inf), len(recorded)
        return outcomes

    def _folds(self) -> list[tuple[str, list[str]]]:
        """(name, models held out together) per fold, in the order of ``models``."""
        c = self.config
        held = [m for m in c.models if c.held_out is None or m in c.held_out]
        if c.split == "model":
            return [(m, [m]) for m in held]
        families = list(dict.fromkeys(family_of(m) for m in held))
        return [(f, [m for m in c.models if family_of(m) == f]) for f in families]

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

    def _tune(self, key: str) -> None:
        """The subgraph's baseline and its own search (``budget`` recipes of ``strategy``)."""
        task = self.tasks[key]
        baseline(task, key, self.measurer, self.backend)
        history = tune_one(task, key, self.measurer, backend=self.backend, strategy=self.config.strategy,
                           budget=self.config.budget, seed=self.config.seed)
        self.own[key] = [(str(r), m) for r, m in history]
        found = best_of(history)
        if found is not None:
            self.best[key] = str(found[0])

    def _cross(self, key: str) -> None:
        """Every other same-kind subgraph's best recipe, adapted, measured on this one (needs every ``_tune``)."""
        task = self.tasks[key]
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
                if self.config.database == "strong":  # a crawl that searched as hard as the strong optimum
                    recipes = sorted(recipes | set(self.strong_recipes.get(key, ())))
                measured |= dict(zip(recipes, self.measurer.measure(task, key, [parse(r) for r in recipes]),
                                     strict=True))
                add_measurements(session, device, self.measurer.table.toolchain, key, measured.items())
                base = baseline(task, key, self.measurer, self.backend)
                profiles[ids[key]] = profile_vector(task, self.subgraphs[key], base, device)
            add_profiles(session, device_id, profiles)
        return database, device_id, ids

    def _fold(self, fold: int, name: str, held_models: Sequence[str]) -> list[HeldOut]:
        held = list(dict.fromkeys(k for m in held_models for k in self.models[m]))
        others = [m for m in self.models if m not in held_models]
        train = list(dict.fromkeys(k for m in others for k in self.models[m]))
        if self.config.split == "family":  # nothing the held-out family has is in its database
            train = [k for k in train if k not in set(held)]
        self.progress(f"fold {fold + 1}: holding out {name} ({len(held)} subgraphs, {len(train)} in the database)")
        database, device_id, ids = self._training_db(fold, train)
        shared = {k for m in others for k in self.models[m]}
        outcomes = {key: self._held_out(name, key, key in shared) for key in held}
        try:
            cost_model = self._cost_model(database, device_id, [ids[k] for k in train if k not in set(held)])
            for encoder in self.config.encoders:
                if encoder == ORACLE:
                    for key in held:
                        with database.scope() as session:
                            ranked = self._oracle_ranking(key, session, device_id, ids)
                        self._transfers(outcomes[key], encoder, functools.partial(_first, ranked), cost_model)
                    continue
                with database.scope() as session:
                    fitted = fit_encoder(session, encoder, device_id=device_id, subgraph_ids=list(ids.values()),
                                         backend=self.backend, seed=self.config.training_seed)
                    index_key = embed_subgraphs(session, fitted, device_id=device_id, subgraph_ids=list(ids.values()))
                index = VectorIndex.open(database, index_key, self.workdir / f"index{fold}", IndexConfig("Flat"))
                for key in held:
                    vector = fitted.encode(self._query_features(key, fitted.uses_profile))[0]
                    with database.scope() as session:
                        near = functools.partial(neighbours, session, index, vector, task=self.tasks[key],
                                                 device_id=device_id, backend=self.backend, exclude={key},
                                                 per_neighbour=self.config.per_neighbour)
                        self._transfers(outcomes[key], encoder, near, cost_model)
        finally:
            database.dispose()
        return [replace(outcomes[key], model=model, transfer=dict(outcomes[key].transfer))
                for model in held_models for key in self.models[model]]

    def _cost_model(self, database: Database, device_id: int, subgraph_ids: list[int]) -> CostModel | None:
        """The fold's cost model (fitted on its training subgraphs' measurements) when a fill needs one."""
        if "model" not in self.config.fill_modes:
            return None
        with database.scope() as session:
            try:
                return fit_cost_model(session, device_id=device_id, toolchain=self.measurer.table.toolchain,
                                      subgraph_ids=subgraph_ids, seed=self.config.seed)
            except ValueError:  # no measurements: the model fill falls back to random recipes
                return None

    def _transfers(self, outcome: HeldOut, encoder: str, near: Callable[..., Sequence[Neighbour]],
                   cost_model: CostModel | None) -> None:
        """Transfer-tune held-out subgraph ``outcome.key`` from ``near(k)`` for each k and fill."""
        c, key = self.config, outcome.key
        for fill in c.fill_modes:
            rank, pool = None, None
            if fill == "model" and cost_model is not None:
                rank = functools.partial(cost_model.predict, static_vector(self.subgraphs[key]))
                pool = self._recorded_pool(key) if c.fill_pool == "recorded" else None
            per_k = {}
            for k in c.ks:
                result = transfer_from(self.tasks[key], key, near(k=k), measurer=self.measurer, backend=self.backend,
                                       wanted=k * c.per_neighbour, local_budget=c.local_budget, seed=c.seed,
                                       fill=fill != "none", rank=rank, pool=pool, library=c.library)
                per_k[k] = _summary(result)
            outcome.transfer[transfer_key(encoder, fill, c)] = per_k

    def _recorded_pool(self, key: str) -> list[Recipe]:
        """The uniform random recipes the run measures on ``key`` anyway: the random baseline's picks, and its own
        search when that is a random one."""
        space = RecipeSpace(self.tasks[key].program, self.backend)
        pool = random_recipes(space, max(self.config.random_k), seed=self.config.seed)
        if self.config.strategy == "random":
            pool += [parse(r) for r, _ in self.own[key]]
        return list(dict.fromkeys(pool))

    def _strong(self, key: str) -> tuple[str, int]:
        """Search held-out subgraph ``key`` for the strong optimum: every recipe of a space under
        ``exhaustive_below``, else ``strong_budget`` new recipes of an evolutionary search seeded with every recipe a
        transfer could take (the cross table: each same-kind subgraph's best, adapted), its own search, the random
        picks and the vendor-ranked recipes; (how, recipes proposed). It runs before the folds and depends on none
        of them (split, encoders, fills), so a recording holds it once for every replay."""
        c, task = self.config, self.tasks[key]
        space = RecipeSpace(task.program, self.backend)

        def measure(recipes: Sequence[Recipe]) -> list[Any]:
            return self.measurer.measure(task, key, list(recipes))

        if space.size() < c.exhaustive_below:
            everything = list(space.enumerate())
            for start in range(0, len(everything), 64):
                measure(everything[start: start + 64])
            self.strong_recipes[key] = [str(r) for r in everything]
            return "exhaustive", len(everything)
        seeds = list(dict.fromkeys([default_recipe(task.program, self.backend), *(parse(r) for r, _ in self.own[key]),
                                    *(parse(r) for r in sorted(set(self.cross[key].values()))),
                                    *random_recipes(space, max(c.random_k), seed=c.seed), *space.vendor_ranked()]))
        searcher = Evolutionary(space, budget=len(seeds) + c.strong_budget, seed=c.seed)
        searcher.asked.update(seeds)  # the budget buys strong_budget recipes the seeds do not hold
        searcher.tell(list(zip(seeds, measure(seeds), strict=True)))
        search(searcher, measure, batch=searcher.population)  # a generation per batch: compiled in parallel
        self.strong_recipes[key] = sorted(str(r) for r in searcher.asked)
        return "evolutionary", len(searcher.asked) - len(seeds)

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

    def _held_out(self, fold: str, key: str, exact: bool) -> HeldOut:
        task = self.tasks[key]
        base = baseline(task, key, self.measurer, self.backend)
        own = dict(self.own[key])
        space = RecipeSpace(task.program, self.backend)
        return HeldOut(fold, key, task.kind, task.name, space.size(), exact, base.default_s, base.eager_s,
                       search_s=min((m.score for m in own.values()), default=math.inf), searched=len(own), fold=fold,
                       library=len(self._libraries(space)))

    def _query_features(self, key: str, profiled: bool) -> FeatureSet:
        subgraph, task = self.subgraphs[key], self.tasks[key]
        static = static_vector(subgraph)
        if not profiled:
            return FeatureSet(static)
        base = baseline(task, key, self.measurer, self.backend)
        return FeatureSet(static, profile_vector(task, subgraph, base, self.measurer.table.device))

    def _random_k(self, key: str) -> dict[int, float]:
        """Best of the default recipe (and, with ``library``, the vendor libraries' implementations) and the first k
        of ``max(random_k)`` uniform random recipes, per k."""
        task, ks = self.tasks[key], self.config.random_k
        space = RecipeSpace(task.program, self.backend)
        picks = random_recipes(space, max(ks), seed=self.config.seed)
        given = [space.default, *self._libraries(space)]
        scores = [r.score for r in self.measurer.measure(task, key, [*given, *picks])]
        return {k: min(scores[: k + len(given)]) for k in ks}

    def _libraries(self, space: RecipeSpace) -> list[Recipe]:
        """The vendor libraries' implementations every method is given with ``library`` (as optimize has them)."""
        return [r for r in space.alternatives if r != space.default] if self.config.library else []


def _first(items: Sequence[Neighbour], k: int) -> Sequence[Neighbour]:
    return items[:k]


def _summary(result: Any) -> dict[str, Any]:
    return {
        "s": result.winner_s, "evaluations": result.evaluations, "winner": result.winner,
        "neighbours": [{"distance": n.distance, "recipe": n.recipe, "changes": list(n.changes)}
                       for n in result.neighbours],
    }


def run_bench(config: BenchConfig, measurer: Measurer, *, workdir: Path | None = None,
              progress: Progress | None = None, shard: Shard | None = None) -> list[HeldOut]:
    """Run the harness (only ``shard``'s measurements, returning nothing, when given); databases and index files go
    to ``workdir`` (a temporary folder by default)."""
    if workdir is not None:
        return TransferBench(config, measurer, workdir=workdir, progress=progress).run(shard)
    with tempfile.TemporaryDirectory(prefix="tunebank-bench-") as tmp:
        return TransferBench(config, measurer, workdir=Path(tmp), progress=progress).run(shard)
