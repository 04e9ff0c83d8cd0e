"""``bench.spmm_graphs``: degree distributions of the generated graphs, and tunebank tasks on a given CSR."""

from pathlib import Path

import numpy as np
import pytest

from bench.spmm_graphs import Csr, powerlaw, reference, spmm_inputs, spmm_task, uniform
from embed.evaluate import evaluate
from embed.lower import lower
from transforms.recipe import parse
from transforms.run import Problem, Worker
from transforms.space import default_recipe
from transforms.tune import Task, evaluator


def _rows_sorted_distinct(csr: Csr) -> bool:
    return all((np.diff(csr.indices[a:b]) > 0).all() for a, b in zip(csr.indptr[:-1], csr.indptr[1:], strict=True))


def test_uniform_rows_have_exactly_the_degree_in_distinct_sorted_columns() -> None:
    csr = uniform(5000, 16, seed=3)
    assert (csr.degrees == 16).all() and csr.nnz == 80_000 and csr.stats()["deg_cv"] == 0.0
    assert csr.indices.dtype == np.int32 and csr.indptr.dtype == np.int32 and csr.values.dtype == np.float32
    assert csr.indices.min() >= 0 and csr.indices.max() < 5000 and _rows_sorted_distinct(csr)
    assert np.isfinite(csr.values).all() and (csr.values > 0).all()
    again, other = uniform(5000, 16, seed=3), uniform(5000, 16, seed=4)
    assert np.array_equal(again.indices, csr.indices) and not np.array_equal(other.indices, csr.indices)


def test_a_degree_as_large_as_the_matrix_fills_each_row() -> None:
    csr = uniform(50, 50)
    assert np.array_equal(csr.indices.reshape(50, 50), np.tile(np.arange(50), (50, 1)))
    with pytest.raises(ValueError, match="exceeds"):
        uniform(50, 51)


def test_powerlaw_degrees_have_the_mean_and_a_heavy_tail() -> None:
    csr = powerlaw(50_000, 8, seed=1)
    stats = csr.stats()
    assert abs(stats["deg_mean"] - 8) < 0.08
    assert stats["deg_max"] <= 50_000 // 50 and csr.degrees.min() >= 1
    assert stats["deg_cv"] > 2 and stats["deg_max"] > 50 * stats["deg_mean"]  # hubs; uniform has cv 0
    assert np.median(csr.degrees) < stats["deg_mean"]  # most rows are light
    assert _rows_sorted_distinct(csr) and csr.indices.max() < 50_000


def test_the_scipy_reference_is_the_evaluator_result() -> None:
    csr = powerlaw(2000, 6, max_degree=300, seed=2)
    task, inputs = spmm_task(csr, 8)
    expected = evaluate(lower(task.graph), inputs)["out"]
    assert np.allclose(reference(inputs), expected, rtol=1e-12, atol=1e-12)
    assert np.array_equal(task.problem.inputs["b3"], spmm_inputs(csr, 8)["dense"])  # inputs b0..b3, then out b4
    assert np.array_equal(next(iter(task.problem.reference.values())), reference(inputs))
    assert task.problem.tolerance == {"b4": pytest.approx(1e-4 * np.sqrt(csr.stats()["deg_max"]) / 4)}
    assert spmm_task(uniform(300, 4), 8)[0].problem.tolerance == {"b4": 1e-4}  # short rows: fp32's own


def test_a_tunebank_kernel_validates_on_a_skewed_csr_and_a_wrong_csr_fails(tmp_path: Path) -> None:
    csr = powerlaw(600, 6, max_degree=120, seed=5)
    assert csr.stats()["deg_max"] > 60  # skewed: a plain ragged loop of the mean degree would miss entries
    task, _ = spmm_task(csr, 16)
    recipes = [default_recipe(task.program, "cpu"), parse("fuse(all);parallel(1);sparse(ell,4)"),
               parse("fuse(all);parallel(1);sparse(csr,4)")]
    shifted = np.roll(task.problem.inputs["b1"], 1)  # every nonzero moved to the previous nonzero's column
    wrong = Task(task.name, task.kind, task.graph, task.program,
                 Problem({**task.problem.inputs, "b1": shifted}, task.problem.reference, task.problem.tolerance))
    with Worker() as worker:
        ok = evaluator(task, backend="cpu", cache_dir=tmp_path, worker=worker, repeats=1, jobs=2)(recipes)
        bad = evaluator(wrong, backend="cpu", cache_dir=tmp_path, worker=worker, repeats=1, jobs=2)(recipes[:1])
    assert [(str(r), res.error[:200]) for r, res in zip(recipes, ok, strict=True) if not res.ok] == []
    assert not bad[0].ok and bad[0].error_kind == "wrong"
