"""The cost model: its target, its trees stored as arrays and predicted without scikit-learn, a planted good recipe
ranked first, the fill taking its best-ranked candidates, and the crawler's refit."""

import math
import random
from pathlib import Path

import numpy as np
import pytest

from db.migrate import upgrade
from db.session import Database
from embed import zoo
from embed.features import FEATURE_NAMES
from embed.partition import partition
from service.cost_model import (
    CostModel,
    CostModelStore,
    cost_model_step,
    fit_cost_model,
    training_set,
    within_subgraph_rank,
)
from service.crawl import crawl
from service.measure import MeasurementTable, Measurer
from service.transfer import _fill
from tests.service.conftest import DEVICE
from transforms.recipe import parse
from transforms.results import RunResult
from transforms.space import RecipeSpace
from transforms.tune import make_task

GOOD = "parallel(0);reduce(r0,warp);tile(p0,4)"


def _seconds(recipe: str, scale: float) -> float:
    """A planted cost: tile 4 and warp reductions are fast, everything else slower; ``scale`` per subgraph."""
    steps = parse(recipe).steps
    tile = next((int(s.args[1]) for s in steps if s.name == "tile"), 1)
    mode = next((str(s.args[1]) for s in steps if s.name == "reduce"), "serial")
    return scale * (1 + abs(math.log2(tile) - 2)) * (0.25 if mode == "warp" else 1.0)


def _synthetic(subgraphs: int = 8, per: int = 40) -> tuple[dict, dict]:
    rng = random.Random(0)
    static, measured = {}, {}
    for g in range(subgraphs):
        static[g] = np.random.default_rng(g).normal(size=len(FEATURE_NAMES))
        scale = 10.0 ** rng.uniform(-6, -2)  # times span orders of magnitude across subgraphs
        recipes = {f"parallel({rng.choice([0, 1])});reduce(r0,{rng.choice(['serial', 'warp', 'block'])});"
                   f"tile(p0,{rng.choice([1, 2, 4, 8, 16, 32])})" for _ in range(per)}
        measured[g] = {r: _seconds(r, scale) for r in recipes if r != GOOD}
        measured[g]["parallel(0);reduce(r0,block);tile(p0,64)"] = "compile_error"
    return static, measured


def test_target_is_the_rank_within_a_subgraph() -> None:
    ranks = within_subgraph_rank([3e-3, 1e-6, "wrong_result", 2e-3, 2e-3])
    assert ranks.tolist() == pytest.approx([0.125, 0.875, 0.0, 0.5, 0.5])  # fastest near 1, ties shared, failure 0


def test_a_planted_good_recipe_ranks_above_bad_ones(tmp_path: Path) -> None:
    static, measured = _synthetic()
    data = training_set(static, measured)
    model = CostModel.fit(data)
    candidates = [parse(r) for r in ("parallel(0);reduce(r0,serial);tile(p0,32)", "parallel(1);reduce(r0,block);"
                                     "tile(p0,1)", GOOD, "parallel(0);reduce(r0,serial);tile(p0,4)")]
    unseen = np.random.default_rng(99).normal(size=len(FEATURE_NAMES))  # a subgraph it never saw
    scores = model.predict(unseen, candidates)
    assert int(np.argmax(scores)) == 2 and scores[2] > scores[3] > scores[0]

    # the stored trees predict what scikit-learn predicts, and a saved model loads (no pickle) to the same scores
    from sklearn.ensemble import GradientBoostingRegressor

    x = model.features(data.static, data.recipes)
    reference = GradientBoostingRegressor(n_estimators=200, max_depth=4, learning_rate=0.1, subsample=0.8,
                                          init="zero", random_state=0).fit(x, data.target)
    assert model.predict(data.static, data.recipes) == pytest.approx(reference.predict(x), abs=1e-9)
    loaded = CostModel.load(model.save(tmp_path / "m.npz"))
    assert loaded.version == model.version and loaded.predict(unseen, candidates) == pytest.approx(scores)
    (tmp_path / "bad.npz").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="cannot read cost model file"):
        CostModel.load(tmp_path / "bad.npz")


def test_the_fill_takes_the_best_ranked_of_its_pool(tiny_subgraphs: list) -> None:
    task = make_task(tiny_subgraphs[0])
    space = RecipeSpace(task.program, "cpu")
    pool = [space.sample(random.Random(n)) for n in range(20)]
    favourite = {pool[7]: 2.0, pool[3]: 1.0}
    filled = _fill(space, [], {space.default}, 2, seed=0, rank=lambda rs: [favourite.get(r, 0.0) for r in rs],
                   pool=pool)
    chosen = [r for r, origin in filled.items() if origin == "model"]
    assert chosen == [pool[7], pool[3]][: len(chosen)] and len(filled) == 2
    assert all(origin in ("vendor", "model") for origin in filled.values())


def test_the_crawler_refits_and_promotes_a_model_that_ranks_held_out_subgraphs(tmp_path: Path,
                                                                             tiny_subgraphs: list) -> None:
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    upgrade(database.engine)

    def run(task, recipes):  # a cost that follows the recipe's integer knobs, so a model can learn it
        return [RunResult(ok=True, median_s=1e-4 * (1 + sum(a for s in r.steps for a in s.args if isinstance(a, int))),
                          repeats=1) for r in recipes]

    measurer = Measurer(MeasurementTable(DEVICE, "synthetic"), run=run, eager_time=lambda task: 1e-3)
    subgraphs = [*tiny_subgraphs, *(s for s in partition(zoo.load("gcn-n256-f32-d0.01")) if s.tunable)]
    crawl(database, subgraphs, measurer, backend="cpu", budget=12)
    store = CostModelStore(tmp_path / "cost_models")
    with database.scope() as session:
        from db.models import Subgraph as Row

        ids = list(session.scalars(Row.__table__.select().with_only_columns(Row.id)))
    result = cost_model_step(database, store, device_id=1, device=DEVICE.name, toolchain="synthetic",
                             subgraph_ids=ids)
    assert result["rows"] > 0 and result["subgraphs"] == len(ids) >= 5
    assert result["promote"] and result["held_out_spearman"] > 0.5, result
    model = store.load(device=DEVICE.name, toolchain="synthetic")
    assert model is not None and model.version == result["version"]
    with database.scope() as session:
        again = fit_cost_model(session, device_id=1, toolchain="synthetic", subgraph_ids=ids)
    assert again.version == model.version  # a refit on the same measurements is the same model
