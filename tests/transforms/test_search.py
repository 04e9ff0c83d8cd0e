import itertools
import math
import random

import pytest

from embed.registry import UnknownNameError
from transforms.recipe import Recipe, Step, format, parse
from transforms.results import RunResult
from transforms.search import create, strategies
from transforms.search.given_candidates import GivenCandidates
from transforms.search.random_search import RandomSearch
from transforms.search.replay import Replay
from transforms.search.space import ProductSpace
from transforms.search.strategy import search


def knob_space(sizes):
    return ProductSpace([[Step(f"knob{d}", (v,)) for v in range(k)] for d, k in enumerate(sizes)])


def key(point):
    return ";".join(f"knob{d}({v})" for d, v in enumerate(point))


def random_table(sizes, seed, fail_every=0):
    rng = random.Random(seed)
    table = {}
    for i, point in enumerate(itertools.product(*map(range, sizes))):
        table[key(point)] = "launch" if fail_every and i % fail_every == 0 else rng.uniform(1e-6, 1e-3)
    return table


def optimum(table):
    return min(v for v in table.values() if not isinstance(v, str))


def structured_table(k=6, d=6):
    """A smooth bowl around a hidden optimum, a small interaction term, and a failing region."""
    best = [(3 * i + 1) % k for i in range(d)]
    table = {}
    for p in itertools.product(range(k), repeat=d):
        cost = 1.0 + sum(0.3 * (p[i] - best[i]) ** 2 / k**2 for i in range(d)) + 0.05 * ((p[0] - p[1]) % 3)
        table[key(p)] = "wrong" if (p[2] == 0 and p[3] == k - 1) else cost
    return table


# --- the product space ---


def test_product_space_enumerates_every_point_once():
    space = knob_space((3, 4, 2))
    recipes = list(space.enumerate())
    assert space.size() == 24 and len(recipes) == 24 and len(set(recipes)) == 24
    assert format(recipes[0]) == "knob0(0);knob1(0);knob2(0)"


def test_mutation_changes_exactly_one_dimension_and_stays_in_the_space():
    space, rng = knob_space((3, 4, 2)), random.Random(0)
    members = set(space.enumerate())
    for _ in range(50):
        recipe = space.sample(rng)
        mutant = space.mutate(recipe, rng)
        assert mutant in members
        assert sum(a != b for a, b in zip(recipe, mutant, strict=True)) == 1


def test_crossover_takes_each_dimension_from_a_parent():
    space, rng = knob_space((5, 5, 5, 5)), random.Random(1)
    a, b = parse("knob0(0);knob1(0);knob2(0);knob3(0)"), parse("knob0(4);knob1(4);knob2(4);knob3(4)")
    children = {space.crossover(a, b, rng) for _ in range(40)}
    assert all(all(s.args[0] in (0, 4) for s in child) for child in children)
    assert len(children) > 4  # genuinely mixes


def test_foreign_recipes_are_projected_into_the_space():
    space, rng = knob_space((3, 4)), random.Random(2)
    foreign = parse("fuse(all);knob1(2)")  # an adapted neighbour recipe: extra step, knob0 missing
    assert space.point(foreign, rng)[1] == 2
    assert space.mutate(foreign, rng) in set(space.enumerate())


# --- strategies against recorded measurements ---


def test_exhaustive_measures_everything_once_and_finds_the_optimum():
    sizes = (3, 4, 2)
    table = random_table(sizes, seed=3)
    replay = Replay(table)
    best = search(create("exhaustive", knob_space(sizes)), replay, batch=5)
    assert best is not None and best[1].median_s == optimum(table)
    assert len(replay.calls) == 24 and len(set(replay.calls)) == 24


@pytest.mark.parametrize("budget", [1, 7, 23])
def test_random_with_budget_n_measures_exactly_n_distinct(budget):
    replay = Replay(random_table((3, 4, 2), seed=4))
    strategy = create("random", knob_space((3, 4, 2)), budget=budget, seed=0)
    search(strategy, replay, batch=4)
    assert len(replay.calls) == budget and len(set(replay.calls)) == budget and strategy.done


def test_random_exhausts_a_small_space_exactly_and_stops():
    replay = Replay(random_table((3, 4, 2), seed=4))
    strategy = RandomSearch(knob_space((3, 4, 2)), budget=1000, seed=5)
    search(strategy, replay, batch=7)
    assert len(replay.calls) == 24 and len(set(replay.calls)) == 24 and strategy.done


@pytest.mark.parametrize("name", ["random", "evolutionary", "exhaustive"])
def test_a_search_told_a_starting_point_it_never_asked_still_ends_on_a_small_space(name):
    replay = Replay(random_table((3, 2), seed=1))
    strategy = create(name, knob_space((3, 2)), budget=50, seed=0)
    start = parse("knob0(0);knob1(0)")
    strategy.tell([(start, replay([start])[0])])  # as tune and crawl do with the default recipe
    for _ in range(100):  # search()'s loop, bounded: a pending-count check never saw this space exhausted
        if strategy.done:
            break
        recipes = strategy.ask(4)
        strategy.tell(list(zip(recipes, replay(recipes), strict=True)))
    assert strategy.done and {format(r) for r in replay.calls} == set(random_table((3, 2), seed=1))


def test_random_is_reproducible_from_its_seed():
    space = knob_space((6, 6, 6))
    first = RandomSearch(space, budget=10, seed=11).ask(10)
    assert first == RandomSearch(space, budget=10, seed=11).ask(10)
    assert first != RandomSearch(space, budget=10, seed=12).ask(10)


def test_ask_never_repeats_and_respects_the_budget():
    strategy = create("evolutionary", knob_space((4, 4)), budget=12, seed=0, population=4)
    replay = Replay(random_table((4, 4), seed=6))
    seen = []
    while not strategy.done:
        batch = strategy.ask(5)
        strategy.tell(list(zip(batch, replay(batch), strict=True)))
        seen += batch
    assert len(seen) == 12 and len(set(seen)) == 12
    assert strategy.ask(5) == [] and strategy.ask(0) == []


def test_evolutionary_beats_random_on_a_structured_landscape():
    table = structured_table()
    space, target = knob_space((6,) * 6), optimum(table) * 1.02
    hits = {}
    for name in ("random", "evolutionary"):
        hits[name] = 0
        for seed in range(20):
            best = search(create(name, space, budget=150, seed=seed), Replay(table), batch=8)
            hits[name] += best is not None and best[1].median_s <= target
    assert hits["evolutionary"] >= 12 and hits["evolutionary"] > hits["random"] + 8, hits


@pytest.mark.parametrize("name", ["exhaustive", "random", "evolutionary"])
def test_failures_are_values_and_never_stop_a_search(name):
    table = random_table((4, 4, 3), seed=7, fail_every=2)  # half the space fails
    replay = Replay(table)
    best = search(create(name, knob_space((4, 4, 3)), budget=40, seed=1), replay, batch=6)
    assert len(replay.calls) == 40
    assert best is not None and best[1].ok
    assert best[1].median_s == min(table[str(r)] for r in replay.calls if not isinstance(table[str(r)], str))


def test_a_search_where_everything_fails_ends_without_a_best():
    table = dict.fromkeys(random_table((3, 3), seed=0), "timeout")
    strategy = create("evolutionary", knob_space((3, 3)), seed=0, population=4)
    assert search(strategy, Replay(table), batch=4) is None and strategy.done and len(strategy.history) == 9


# --- given candidates (the transfer hook) ---


def test_given_candidates_are_measured_first_in_order_then_local_search_improves():
    table = structured_table()
    candidates = ["knob0(0);knob1(0);knob2(1);knob3(0);knob4(0);knob5(0)",
                  "knob0(5);knob1(5);knob2(5);knob3(5);knob4(5);knob5(5)",
                  "knob0(0);knob1(0);knob2(1);knob3(0);knob4(0);knob5(0)"]  # a duplicate
    replay = Replay(table)
    strategy = create("given_candidates", knob_space((6,) * 6), candidates=candidates, local_budget=30, seed=0)
    best = search(strategy, replay, batch=4)
    assert [str(r) for r in replay.calls[:2]] == candidates[:2]
    assert len(replay.calls) == 32 and len(set(replay.calls)) == 32
    assert best is not None and best[1].median_s < min(table[c] for c in candidates)


def test_given_candidates_without_local_budget_measure_exactly_the_list():
    table = random_table((3, 3), seed=8)
    candidates = [parse(k) for k in list(table)[:4]]
    replay = Replay(table)
    best = search(GivenCandidates(knob_space((3, 3)), candidates), replay, batch=3)
    assert replay.calls == candidates
    assert best is not None and best[1].median_s == min(table[str(c)] for c in candidates)


def test_given_candidates_that_all_fail_skip_the_local_search():
    table = random_table((3, 3), seed=9)
    first = list(table)[0]
    table[first] = "compile"
    strategy = GivenCandidates(knob_space((3, 3)), [first], local_budget=5)
    replay = Replay(table)
    assert search(strategy, replay) is None and strategy.done and len(replay.calls) == 1


# --- registry and replay ---


def test_strategies_are_registered_by_name():
    assert strategies.names() == ["evolutionary", "exhaustive", "given_candidates", "random"]
    with pytest.raises(UnknownNameError, match="choose one of: evolutionary, exhaustive"):
        create("annealing", knob_space((2,)))
    instance = RandomSearch(knob_space((2,)))
    assert create(instance, knob_space((3,))) is instance


def test_replay_reports_unknown_recipes_and_kinds():
    with pytest.raises(ValueError, match="unknown error kinds"):
        Replay({"a()": "segfault"})
    with pytest.raises(KeyError, match="no recorded measurement"):
        Replay({"a()": 1.0})([Recipe((Step("b"),))])
    assert Replay({"a()": "nan"})([parse("a()")]) == [RunResult.failure("nan", "replayed failure")]
    assert math.isinf(Replay({"a()": "nan"})([parse("a()")])[0].score)
