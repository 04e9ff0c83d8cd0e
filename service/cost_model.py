"""A learned cost model that ranks recipes for a subgraph: gradient-boosted trees (scikit-learn) over the
subgraph's static features (``embed.features``, as stored with each subgraph) and the recipe's parsed knobs, trained
on the database's measurements of one device and toolchain. Transfer's fill asks it which of a pool of candidate
recipes to measure in the places the neighbours leave (``service.transfer``); the crawler refits it after its cross
table (:func:`cost_model_step`).

    model = fit_cost_model(session, device_id=d, toolchain=t, subgraph_ids=ids)
    scores = model.predict(static_vector(subgraph), recipes)   # higher: predicted faster on that subgraph

**Target: the recipe's relative rank within its subgraph** (1 for the fastest measured, towards 0 for the slowest,
0 for a failure), not its speedup over eager. The fill only ever compares recipes of one subgraph, so only the order
within a subgraph matters; times and speedups span orders of magnitude across subgraphs (a per-subgraph offset the
trees would spend their splits on), eager is missing where PyTorch cannot run a subgraph, and a failed kernel has no
time at all but a natural rank (last).

**Recipe features**: a vocabulary fixed at fit time from the training recipes. Per step name, whether the recipe has
it; per integer argument (by step and position, or keyword), ``log2(1 + v)`` (-1 when absent); per other argument
(a role such as ``p1``, a mode such as ``warp``), one column per value seen (1 where the recipe has it).

**Stored without pickle**: the fitted trees are plain arrays (``CostModel.state``) in an ``.npz`` file read with
``allow_pickle=False`` and predicted with NumPy, as the encoders are stored (``service.embeddings.EncoderStore``);
nothing a client sent is ever loaded as code.
"""

import hashlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import Measurement, Recipe
from db.models import Subgraph as SubgraphRow
from db.session import Database
from embed.arrays_file import load_arrays, save_arrays, state_digest
from embed.features import FEATURE_NAMES
from transforms.recipe import Recipe as RecipeSteps
from transforms.recipe import parse

log = logging.getLogger(__name__)

FORMAT = "tunebank-cost-model-1"
HOLD_OUT_EVERY = 5  # the crawler's check: every fifth subgraph is held out of a trial fit
MAX_ROWS = 50_000  # a fit takes at most this many measurements (a seeded sample of them)


def recipe_tokens(recipe: RecipeSteps) -> dict[str, float]:
    """The recipe's knobs as named values: ``has:NAME`` 1, ``NAME[i]`` / ``NAME.key`` log2(1 + int), and
    ``NAME[i]=value`` 1 for a role or identifier argument."""
    out: dict[str, float] = {}
    for step in recipe.steps:
        out[f"has:{step.name}"] = 1.0
        params = [(f"{step.name}[{i}]", v) for i, v in enumerate(step.args)]
        params += [(f"{step.name}.{k}", v) for k, v in step.kwargs]
        for name, value in params:
            if isinstance(value, int):
                out[name] = math.copysign(math.log2(1 + abs(value)), value)
            else:
                out[f"{name}={value}"] = 1.0
    return out


def _numeric(column: str) -> bool:
    return not column.startswith("has:") and "=" not in column


def within_subgraph_rank(values: Sequence[float | str]) -> np.ndarray:
    """Target of each measurement of one subgraph: 1 - (rank + 0.5) / n among the ok ones (ties share their mean
    rank; fastest near 1), 0 for a failure (a string: its error kind)."""
    times = np.array([v if not isinstance(v, str) and math.isfinite(v) else np.inf for v in values], dtype=float)
    ok = np.isfinite(times)
    out = np.zeros(len(times))
    if ok.any():
        from scipy.stats import rankdata

        ranks = rankdata(times[ok]) - 1  # 0 = fastest, ties averaged
        out[ok] = 1 - (ranks + 0.5) / ok.sum()
    return out


@dataclass(frozen=True)
class TrainingSet:
    """One row per measurement: its subgraph's static features, its recipe, its target; ``groups``: the subgraph."""

    static: np.ndarray  # (rows, len(FEATURE_NAMES))
    recipes: list[RecipeSteps]
    target: np.ndarray
    groups: np.ndarray

    def __len__(self) -> int:
        return len(self.recipes)

    def subset(self, mask: np.ndarray) -> "TrainingSet":
        index = np.flatnonzero(mask)
        return TrainingSet(self.static[index], [self.recipes[i] for i in index], self.target[index],
                           self.groups[index])


def training_set(static: dict[Any, np.ndarray], measured: dict[Any, dict[str, float | str]]) -> TrainingSet:
    """Rows from ``measured`` (group -> canonical recipe -> seconds or error kind) with ``static[group]``; groups
    with fewer than two measurements say nothing about order and are left out."""
    rows_static, recipes, target, groups = [], [], [], []
    for group, results in measured.items():
        if len(results) < 2:
            continue
        texts = sorted(results)
        ranks = within_subgraph_rank([results[t] for t in texts])
        for text, rank in zip(texts, ranks, strict=True):
            rows_static.append(static[group])
            recipes.append(parse(text))
            target.append(rank)
            groups.append(group)
    width = len(FEATURE_NAMES)
    labels = np.empty(len(groups), dtype=object)  # groups may be tuples: one object each, not a 2-D array
    for n, group in enumerate(groups):
        labels[n] = group
    return TrainingSet(np.array(rows_static, dtype=float).reshape(-1, width), recipes, np.array(target, dtype=float),
                       labels)


class CostModel:
    """Fitted trees as arrays; ``predict`` scores recipes for one subgraph (higher: predicted faster)."""

    def __init__(self, vocabulary: Sequence[str], state: dict[str, np.ndarray], info: dict[str, Any]) -> None:
        self.vocabulary = tuple(vocabulary)
        self._columns = {c: n for n, c in enumerate(self.vocabulary)}
        self.state = state
        self.info = info

    @classmethod
    def fit(cls, data: TrainingSet, *, seed: int = 0, trees: int = 200, depth: int = 4,
            learning_rate: float = 0.1) -> "CostModel":
        from sklearn.ensemble import GradientBoostingRegressor

        if len(data) == 0:
            raise ValueError("no measurements to fit a cost model on")
        if len(data) > MAX_ROWS:
            keep = np.zeros(len(data), dtype=bool)
            keep[np.random.default_rng(seed).choice(len(data), MAX_ROWS, replace=False)] = True
            data = data.subset(keep)
        vocabulary = sorted({c for r in data.recipes for c in recipe_tokens(r)})
        model = cls(vocabulary, {}, {})
        x = model.features(data.static, data.recipes)
        fitted = GradientBoostingRegressor(n_estimators=trees, max_depth=depth, learning_rate=learning_rate,
                                           subsample=0.8, init="zero", random_state=seed).fit(x, data.target)
        model.state = _tree_arrays(fitted, learning_rate)
        model.info = {"rows": len(data), "subgraphs": len(set(data.groups.tolist())), "trees": trees,
                      "depth": depth, "target": "within-subgraph rank"}
        return model

    def features(self, static: np.ndarray, recipes: Sequence[RecipeSteps]) -> np.ndarray:
        """Rows of [static features, recipe columns]; ``static``: one row per recipe, or one row for all."""
        static = np.atleast_2d(np.asarray(static, dtype=float))
        if len(static) == 1:
            static = np.repeat(static, len(recipes), axis=0)
        knobs = np.array([[-1.0 if _numeric(c) else 0.0 for c in self.vocabulary]] * len(recipes)).reshape(
            len(recipes), len(self.vocabulary))
        for row, recipe in enumerate(recipes):
            for name, value in recipe_tokens(recipe).items():
                column = self._columns.get(name)
                if column is not None:
                    knobs[row, column] = value
        return np.hstack([static, knobs])

    def predict(self, static: np.ndarray, recipes: Sequence[RecipeSteps]) -> np.ndarray:
        """Predicted within-subgraph rank of each recipe on the subgraph with static features ``static``."""
        if not recipes:
            return np.zeros(0)
        return _predict(self.state, self.features(static, recipes))

    @property
    def version(self) -> str:
        return state_digest(f"{FORMAT}|{'|'.join(self.vocabulary)}", self.state)

    def save(self, path: Path) -> Path:
        return save_arrays(path, {"format": FORMAT, "vocabulary": list(self.vocabulary), "info": self.info}, self.state)

    @classmethod
    def load(cls, path: Path) -> "CostModel":
        header, state = load_arrays(path, FORMAT, "cost model file")
        return cls(header["vocabulary"], state, header.get("info", {}))


def _tree_arrays(fitted: Any, learning_rate: float) -> dict[str, np.ndarray]:
    """The regressor's trees, concatenated: per node its feature, threshold, children (absolute; -1 at a leaf) and
    value already scaled by the learning rate; ``roots``: each tree's first node."""
    features, thresholds, left, right, values, roots = [], [], [], [], [], []
    offset = 0
    for (estimator,) in fitted.estimators_:
        tree = estimator.tree_
        roots.append(offset)
        leaf = tree.children_left < 0
        features.append(np.where(leaf, 0, tree.feature))
        thresholds.append(tree.threshold)
        left.append(np.where(leaf, -1, tree.children_left + offset))
        right.append(np.where(leaf, -1, tree.children_right + offset))
        values.append(tree.value[:, 0, 0] * learning_rate)
        offset += tree.node_count
    return {"feature": np.concatenate(features).astype(np.int64), "threshold": np.concatenate(thresholds),
            "left": np.concatenate(left).astype(np.int64), "right": np.concatenate(right).astype(np.int64),
            "value": np.concatenate(values), "roots": np.array(roots, dtype=np.int64)}


def _predict(state: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    feature, threshold, left, right = state["feature"], state["threshold"], state["left"], state["right"]
    rows = np.arange(len(x))
    node = np.repeat(state["roots"][None, :], len(x), axis=0)  # (rows, trees)
    while True:
        inner = left[node] >= 0
        if not inner.any():
            break
        go_left = x[rows[:, None], feature[node]] <= threshold[node]
        node = np.where(inner, np.where(go_left, left[node], right[node]), node)
    return state["value"][node].sum(axis=1)


def stored_training_set(session: Session, *, device_id: int, toolchain: str | None,
                        subgraph_ids: Sequence[int]) -> TrainingSet:
    """Every measurement of ``subgraph_ids`` on the device (and toolchain, when given) as a training set."""
    static = {}
    measured: dict[Any, dict[str, float | str]] = {}
    ids = list(subgraph_ids)
    for start in range(0, len(ids), 500):
        page = ids[start: start + 500]
        for sid, features in session.execute(select(SubgraphRow.id, SubgraphRow.features)
                                             .where(SubgraphRow.id.in_(page))):
            static[sid] = np.array([(features or {}).get(n, 0.0) for n in FEATURE_NAMES], dtype=float)
        query = (select(Measurement.subgraph_id, Measurement.toolchain, Recipe.canonical, Measurement.ok,
                        Measurement.median_s, Measurement.error_kind)
                 .join(Recipe, Recipe.id == Measurement.recipe_id)
                 .where(Measurement.device_id == device_id, Measurement.subgraph_id.in_(page)))
        if toolchain is not None:
            query = query.where(Measurement.toolchain == toolchain)
        for sid, chain, recipe, ok, median, error in session.execute(query):
            # ranks are taken within one subgraph and one toolchain: timings of two toolchains do not mix
            measured.setdefault((sid, chain), {})[recipe] = median if ok and median is not None else str(error)
    by_group = {group: static[group[0]] for group in measured}
    return training_set(by_group, measured)


def fit_cost_model(session: Session, *, device_id: int, toolchain: str | None, subgraph_ids: Sequence[int],
                   seed: int = 0) -> CostModel:
    """A cost model fitted on the stored measurements of ``subgraph_ids`` (ValueError when there are none)."""
    return CostModel.fit(stored_training_set(session, device_id=device_id, toolchain=toolchain,
                                             subgraph_ids=subgraph_ids), seed=seed)


def ranking_quality(model: CostModel, data: TrainingSet) -> float:
    """Mean Spearman correlation, over the subgraphs of ``data``, between predicted and measured order (0: no
    better than a random order; nan when no subgraph has two distinct targets)."""
    from scipy.stats import spearmanr

    found = []
    for group in dict.fromkeys(data.groups.tolist()):
        part = data.subset(np.array([g == group for g in data.groups], dtype=bool))
        if len(set(part.target.tolist())) < 2:
            continue
        predicted = model.predict(part.static, part.recipes)
        if len(set(predicted.tolist())) < 2:
            found.append(0.0)
            continue
        found.append(float(spearmanr(predicted, part.target).statistic))
    return float(np.mean(found)) if found else math.nan


class CostModelStore:
    """Fitted cost models as ``DIR/SCOPE/VERSION.npz``, SCOPE a digest of the device and toolchain they were fitted
    for, and ``DIR/SCOPE/promoted`` naming the version in use."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def _folder(self, device: str, toolchain: str) -> Path:
        return self.directory / hashlib.sha256(f"{device}|{toolchain}".encode()).hexdigest()[:16]

    def save(self, model: CostModel, *, device: str, toolchain: str) -> Path:
        return model.save(self._folder(device, toolchain) / f"{model.version}.npz")

    def promoted(self, *, device: str, toolchain: str) -> str | None:
        path = self._folder(device, toolchain) / "promoted"
        return json.loads(path.read_text())["version"] if path.exists() else None

    def promote(self, version: str, *, device: str, toolchain: str) -> None:
        folder = self._folder(device, toolchain)
        if not (folder / f"{version}.npz").exists():
            raise LookupError(f"no stored cost model {version!r} for {device}")
        (folder / "promoted").write_text(json.dumps({"version": version}))

    def load(self, *, device: str, toolchain: str, version: str | None = None) -> CostModel | None:
        """The promoted (or named) model for the device and toolchain; None when there is none."""
        version = version or self.promoted(device=device, toolchain=toolchain)
        if version is None:
            return None
        return CostModel.load(self._folder(device, toolchain) / f"{version}.npz")


def cost_model_step(database: Database, store: CostModelStore, *, device_id: int, device: str, toolchain: str,
                    subgraph_ids: Sequence[int], seed: int = 0) -> dict[str, Any]:
    """The crawl's refit, after its cross table: a trial fit with every fifth subgraph held out must rank those
    better than a random order (mean Spearman > 0); then the model fitted on all of them is saved and promoted."""
    with database.scope() as session:
        data = stored_training_set(session, device_id=device_id, toolchain=toolchain, subgraph_ids=subgraph_ids)
    groups = list(dict.fromkeys(data.groups.tolist()))
    figures: dict[str, Any] = {"rows": len(data), "subgraphs": len(groups), "promote": False}
    held = set(groups[::HOLD_OUT_EVERY])
    in_held = np.array([g in held for g in data.groups], dtype=bool)
    if len(groups) < HOLD_OUT_EVERY or in_held.all() or not in_held.any():
        return {**figures, "reason": f"{len(groups)} subgraphs with measurements, fewer than {HOLD_OUT_EVERY}"}
    trial = CostModel.fit(data.subset(~in_held), seed=seed)
    quality = ranking_quality(trial, data.subset(in_held))
    figures["held_out_spearman"] = quality
    if not quality > 0:
        return {**figures, "reason": f"held-out Spearman {quality:.3f} <= 0: not promoted"}
    model = CostModel.fit(data, seed=seed)
    store.save(model, device=device, toolchain=toolchain)
    store.promote(model.version, device=device, toolchain=toolchain)
    log.info("cost model %s: held-out Spearman %.3f", model.version, quality)
    return {**figures, "promote": True, "version": model.version,
            "reason": f"held-out Spearman {quality:.3f} > 0"}
