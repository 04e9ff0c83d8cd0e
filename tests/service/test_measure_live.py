"""The live measurer's incumbent: what the table already holds for a subgraph (eager's time too) cuts a candidate far
slower than it short to one timed call, on a real cpu kernel."""

import math
from dataclasses import replace

import pytest

from embed import zoo
from embed.partition import partition
from service.measure import MeasurementTable, live_measurer
from tests.service.conftest import DEVICE
from transforms.run import SLOWER_FLOOR_S, Worker
from transforms.space import default_recipe
from transforms.tune import make_task


def test_the_fastest_time_held_counts_eager_and_kernels_but_not_failures():
    table = MeasurementTable(DEVICE, "t", results={"s": {"a": 3e-3, "b": "wrong", "c": 2e-3}}, eager={"s": 1e-3})
    assert table.fastest("s") == 1e-3
    table.eager["s"] = None  # eager could not run it
    assert table.fastest("s") == 2e-3
    assert table.fastest("other") == math.inf


def test_a_candidate_far_slower_than_eager_is_timed_by_one_call(tmp_path):
    [subgraph] = [s for s in partition(zoo.load("lm_head-h256-v2048-t64")) if "matmul" in s.ops]
    task = replace(make_task(subgraph), key=subgraph.structural_hash)
    seen = []
    with Worker() as worker:
        for eager_s in (None, 1e-7):
            table = MeasurementTable(DEVICE, "t", eager={task.key: eager_s} if eager_s else {})
            measurer = live_measurer(table, backend="cpu", cache_dir=tmp_path, worker=worker, repeats=5,
                                     record=lambda task, recipes, results: seen.extend(results))
            measurer.measure(task, task.key, [default_recipe(task.program, "cpu")])
    timed, cut_short = seen
    assert timed.ok and timed.repeats == 5 and timed.median_s > SLOWER_FLOOR_S  # slow enough to be cut short at all
    assert cut_short.ok and cut_short.repeats == 1
    assert cut_short.median_s == pytest.approx(timed.median_s, rel=1.0)
