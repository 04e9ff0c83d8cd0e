"""Crawl into a database, embed, and transfer-tune from it (synthetic measurements: no timing noise)."""

import math
import random
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select

import service.transfer
from db.index import IndexConfig, VectorIndex
from db.migrate import upgrade
from db.models import Embedding, Measurement
from db.models import Subgraph as DbSubgraph
from db.session import Database
from embed import zoo
from embed.builder import GraphBuilder
from embed.features import static_features
from embed.partition import partition
from embed.subgraph import Subgraph
from service.crawl import crawl
from service.embeddings import embed_subgraphs, fit_encoder, profiled_subgraphs
from service.store import FAILED_LOSS, transfer_pairs
from service.transfer import Neighbour, random_recipes, transfer_tune
from tests.service.conftest import synthetic_measurer, synthetic_seconds
from transforms.contraction import LT_ALGOS
from transforms.recipe import parse
from transforms.space import RecipeSpace, default_recipe
from transforms.tune import make_task


def test_crawl_stores_searches_cross_table_and_profiles(tmp_path: Path, tiny_subgraphs: list[Subgraph]) -> None:
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    upgrade(database.engine)
    measurer = synthetic_measurer()
    report = crawl(database, tiny_subgraphs, measurer, backend="cpu", budget=6)
    assert report.subgraphs == 4 and len(report.best) == 4
    assert report.cross_applications >= 4  # each subgraph got the best recipe of the other one of its kind
    with database.scope() as session:
        assert session.scalar(select(func.count()).select_from(Measurement)) == report.measurements
        ids = profiled_subgraphs(session, 1)
        assert len(ids) == 4
        pairs = transfer_pairs(session, 1, ids, "cpu")
        # pairs only of the same kind (ids: contraction, reduction, reduction, contraction), and only where the
        # current best of b (which the cross table may have improved) was measured on a
        assert 2 <= len(pairs) <= 4 and np.all(pairs.loss >= 0) and np.all(pairs.loss <= FAILED_LOSS)
        assert set(zip(pairs.a.tolist(), pairs.b.tolist(), strict=True)) <= {(0, 3), (3, 0), (1, 2), (2, 1)}

        encoder = fit_encoder(session, "static", device_id=1, subgraph_ids=ids, backend="cpu")
        key = embed_subgraphs(session, encoder, device_id=1, subgraph_ids=ids)
        assert session.scalar(select(func.count()).where(Embedding.encoder == "static")) == 4
    index = VectorIndex.open(database, key, tmp_path / "index", IndexConfig("Flat"))

    query = tiny_subgraphs[0]
    task = make_task(query)
    vector = encoder.encode(_features(query))[0]
    with database.scope() as session:
        result = transfer_tune(task, query.structural_hash, vector, session=session, index=index, device_id=1,
                               measurer=measurer, backend="cpu", k=3, exclude={query.structural_hash})
        kept = transfer_tune(task, query.structural_hash, vector, session=session, index=index, device_id=1,
                             measurer=measurer, backend="cpu", k=1, local_budget=3)
        wide = transfer_tune(task, query.structural_hash, vector, session=session, index=index, device_id=1,
                             measurer=measurer, backend="cpu", k=3, exclude={query.structural_hash}, per_neighbour=3)
        filled = transfer_tune(task, query.structural_hash, vector, session=session, index=index, device_id=1,
                               measurer=measurer, backend="cpu", k=3, exclude={query.structural_hash}, fill=True)
    (neighbour,) = result.neighbours  # one other subgraph of the same kind; the query itself is excluded
    assert neighbour.newer_knobs == ()  # crawled with every knob its space has
    assert neighbour.structural_hash != query.structural_hash and neighbour.distance > 0
    assert result.tried[0].origin == "default" and result.tried[0].recipe == str(default_recipe(task.program))
    assert result.evaluations == len({t.recipe for t in result.tried}) <= 2
    cost = {t.recipe: synthetic_seconds(task, parse(t.recipe)) for t in result.tried}  # the cost model, not the run
    assert (result.winner_s, result.default_s) == (min(cost.values()), cost[str(default_recipe(task.program))])
    assert result.winner == min(cost, key=cost.get)
    # each neighbour gives its 3 fastest recipes, fastest first, the best one being what per_neighbour=1 took
    sources = [n.source_recipe for n in wide.neighbours]
    times = [measurer.table.results[neighbour.structural_hash][r] for r in sources]
    assert {n.structural_hash for n in wide.neighbours} == {neighbour.structural_hash}
    assert len(set(sources)) == 3 and sources[0] == neighbour.source_recipe and times == sorted(times)
    assert wide.evaluations > result.evaluations
    assert kept.neighbours[0].distance == 0.0  # not excluded: the query's own row is its nearest neighbour
    assert [t.origin for t in kept.tried].count("local") == 3 and math.isfinite(kept.winner_s)
    # one neighbour recipe for k = 3: two random recipes fill the rest, the first two not already tried
    origins = [t.origin for t in filled.tried]
    assert filled.evaluations == 4 and origins.count("neighbour") == 1 and origins.count("random") == 2
    tried = {default_recipe(task.program), *(parse(n.recipe) for n in result.neighbours)}
    assert [parse(t.recipe) for t in filled.tried if t.origin == "random"] == [
        r for r in random_recipes(RecipeSpace(task.program, "cpu"), 5, seed=0) if r not in tried][:2]
    assert filled.winner_s <= result.winner_s


def test_fill_first_tries_the_knobs_a_stored_recipe_predates(monkeypatch: pytest.MonkeyPatch,
                                                             tiny_subgraphs: list[Subgraph]) -> None:
    query = tiny_subgraphs[0]
    task = make_task(query)
    space = RecipeSpace(task.program, "cpu")
    knob = max((options for options in space.dims), key=len)[0].name  # the knob with the most values
    adapted = space.legal(space.sample(random.Random(1)))
    stored = ";".join(s for s in str(adapted).split(";") if not s.startswith(f"{knob}("))  # crawled before it
    near = [Neighbour(1, "n", 0.5, stored, str(adapted), (), (knob,))]
    monkeypatch.setattr(service.transfer, "neighbours", lambda *args, **kwargs: near)
    result = transfer_tune(task, query.structural_hash, np.zeros(4), session=None, index=None,  # type: ignore[arg-type]
                           device_id=1, measurer=synthetic_measurer(), backend="cpu", k=3, fill=True)
    origins = [t.origin for t in result.tried]
    variants = [parse(t.recipe) for t in result.tried if t.origin == "variant"]
    assert origins.count("neighbour") == 1 and len(variants) == 2 and "random" not in origins
    assert variants == [v for v in space.variants(adapted, {knob}) if v != space.default][:2]
    assert all(sum(a != b for a, b in zip(v.steps, adapted.steps, strict=True)) == 1 for v in variants)
    near[0] = Neighbour(1, "n", 0.5, str(adapted), str(adapted), ())  # no knob newer than it: random fill
    result = transfer_tune(task, query.structural_hash, np.zeros(4), session=None, index=None,  # type: ignore[arg-type]
                           device_id=1, measurer=synthetic_measurer(), backend="cpu", k=3, fill=True)
    assert [t.origin for t in result.tried].count("random") == 2
    assert service.transfer._own_space('{"not": "a graph"}', "cpu") is None  # an old document: no variants
    assert service.transfer._own_space(query.graph.to_json(), "cpu").dims == space.dims
    assert service.transfer._own_space(query.graph.to_json(), "cpu") is service.transfer._own_space(
        query.graph.to_json(), "cpu")  # built once per document


def test_fill_takes_the_vendor_libraries_ranking_before_random_recipes(monkeypatch: pytest.MonkeyPatch) -> None:
    b = GraphBuilder("matmul")
    x, w = b.input("x", (64, 32), "float16"), b.param("w", (32, 48), "float16")
    task = make_task(b.build([b.node("matmul", [x, w], (64, 48), "float16", name="out")]))
    near = [Neighbour(1, "n", 0.5, "gemm(cublas)", "gemm(cublas)", ())]
    monkeypatch.setattr(service.transfer, "neighbours", lambda *args, **kwargs: near)

    def tried(k: int) -> list[tuple[str, str]]:
        result = transfer_tune(task, "q", np.zeros(4), session=None, index=None,  # type: ignore[arg-type]
                               device_id=1, measurer=synthetic_measurer(), backend="cuda", k=k, fill=True)
        return [(t.origin, t.recipe) for t in result.tried]

    # the default is cuBLASLt's first algorithm; its next ones fill the places the one neighbour leaves
    assert tried(5) == [("default", "gemm(cublaslt,0)"), ("neighbour", "gemm(cublas)"),
                        *[("vendor", f"gemm(cublaslt,{rank})") for rank in range(1, 5)]]
    wide = tried(12)  # past the ranking: random recipes (generated kernels)
    assert [origin for origin, _ in wide].count("vendor") == LT_ALGOS - 1
    assert [origin for origin, _ in wide][-4:] == ["random"] * 4
    assert all(recipe.startswith("gemm(mma,") for origin, recipe in wide if origin == "random")


def test_the_vendor_library_is_a_candidate_however_many_neighbours_there_are() -> None:
    from tests.transforms.test_vendor import conv_block, subgraphs

    task = make_task(subgraphs(conv_block(), "conv2d")[1])  # the depthwise 7x7 conv with its bias
    space = RecipeSpace(task.program, "cpu")
    near = [Neighbour(n, f"n{n}", 0.5, str(r), str(r), ()) for n, r in
            enumerate(random_recipes(space, 3, seed=0))]  # neighbours enough for every place

    def tried(library: bool) -> list[tuple[str, str]]:
        result = service.transfer.transfer_from(task, "q", near, measurer=synthetic_measurer(), backend="cpu",
                                                wanted=3, fill=True, library=library)
        return [(t.origin, t.recipe) for t in result.tried]

    assert ("vendor", "conv(torch)") not in tried(False) and ("library", "conv(torch)") not in tried(False)
    with_library = tried(True)
    assert with_library[:2] == [("default", str(space.default)), ("library", "conv(torch)")]
    assert [origin for origin, _ in with_library].count("neighbour") == 3


@pytest.mark.parametrize("wanted", [0, 1, 2])
def test_wanted_caps_the_neighbours_recipes_to_the_nearest_ones_and_never_the_library(wanted: int) -> None:
    from tests.transforms.test_vendor import conv_block, subgraphs

    task = make_task(subgraphs(conv_block(), "conv2d")[1])
    space = RecipeSpace(task.program, "cpu")
    recipes = random_recipes(space, 3, seed=0)
    near = [Neighbour(n, f"n{n}", 0.5 + n, str(r), str(r), ()) for n, r in enumerate(recipes)]  # nearest first
    result = service.transfer.transfer_from(task, "q", near, measurer=synthetic_measurer(), backend="cpu",
                                            wanted=wanted, fill=True, library=True)
    assert [(t.origin, t.recipe) for t in result.tried] == [
        ("default", str(space.default)), ("library", "conv(torch)"),
        *[("neighbour", str(r)) for r in recipes[:wanted]]]


def _features(subgraph: Subgraph):  # noqa: ANN202
    from embed.encoders import FeatureSet

    return FeatureSet(static_features(make_task(subgraph).program, family_hash=subgraph.family_hash).as_array())


def test_transfer_takes_exactly_the_k_nearest_neighbours(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    upgrade(database.engine)
    shapes = [(32, 128, 16), (32, 128, 48), (32, 256, 32), (32, 256, 8), (32, 512, 16), (32, 512, 64), (32, 384, 24)]
    softmaxes = [s for h, v, t in shapes for s in partition(zoo.load(f"lm_head-h{h}-v{v}-t{t}"))
                 if s.tunable and s.kind == "reduction"]
    measurer = synthetic_measurer()
    crawl(database, softmaxes, measurer, backend="cpu", strategy="random", budget=3, cross=False)
    with database.scope() as session:
        ids = profiled_subgraphs(session, 1)
        encoder = fit_encoder(session, "static", device_id=1, subgraph_ids=ids, backend="cpu")
        key = embed_subgraphs(session, encoder, device_id=1, subgraph_ids=ids)
        stored = {s.structural_hash: np.frombuffer(v, dtype=np.float32) for s, v in session.execute(
            select(DbSubgraph, Embedding.vector).join(Embedding, Embedding.subgraph_id == DbSubgraph.id)
            .where(Embedding.encoder == "static"))}
    index = VectorIndex.open(database, key, tmp_path / "index", IndexConfig("Flat"))
    query = softmaxes[0]
    task, vector = make_task(query), encoder.encode(_features(query))[0]
    others = sorted((h for h in stored if h != query.structural_hash),
                    key=lambda h: float(((stored[h] - vector) ** 2).sum()))
    assert len(others) == len(shapes) - 1
    for k in (1, 3, 5):
        with database.scope() as session:
            result = transfer_tune(task, query.structural_hash, vector, session=session, index=index, device_id=1,
                                   measurer=measurer, backend="cpu", k=k, exclude={query.structural_hash})
        assert [n.structural_hash for n in result.neighbours] == others[:k]
        for n in result.neighbours:  # each gives its fastest measured recipe, and that recipe is tried
            measured = measurer.table.results[n.structural_hash]
            assert n.source_recipe == min(measured, key=measured.get)
            assert n.recipe in {t.recipe for t in result.tried if t.origin in ("neighbour", "default")}


@pytest.mark.parametrize("explore", [False, True])
def test_without_explore_the_fill_stops_at_the_variants_and_vendor_recipes(explore: bool) -> None:
    from tests.transforms.kernels import single

    task = make_task(single("add", [("a", (64, 32), "float32"), ("b", (64, 32), "float32")], (64, 32)))
    space = RecipeSpace(task.program, "cpu")
    result = service.transfer.transfer_from(task, "q", [], measurer=synthetic_measurer(), backend="cpu", wanted=3,
                                            fill=True, explore=explore)
    origins = [t.origin for t in result.tried]
    assert origins == ["default", *["random"] * 3] if explore else origins == ["default"]
    assert not space.vendor_ranked()  # an elementwise subgraph has no library path: only random recipes fill it
