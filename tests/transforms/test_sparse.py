"""``sparse(...)``: SpMM iteration formats validated on the cpu against float64 and compiled to PTX for cuda."""

from pathlib import Path

import numpy as np
import pytest

from embed import zoo
from embed.evaluate import evaluate
from embed.lower import lower
from embed.partition import partition
from tests.transforms.kernels import measure, single
from transforms.build import Source, build
from transforms.codegen import generate
from transforms.codegen.kernel import compute_dtype
from transforms.codegen.signature import signature
from transforms.compilers import cuda
from transforms.problem import tolerances
from transforms.recipe import parse
from transforms.run import TOLERANCE, Problem, Worker
from transforms.schedule import ScheduleError
from transforms.space import RecipeSpace
from transforms.transformation import apply_recipe
from transforms.tune import Task, evaluator

RECIPES = ("fuse(all);parallel(1);sparse(csr)", "fuse(all);parallel(1);sparse(csr,4)",
           "fuse(none);parallel(1);tile(p1,4);sparse(csr,8)", "fuse(all);parallel(1);sparse(ell,4)",
           "fuse(none);reduce(lanes,4);sparse(ell,8)", "fuse(all);parallel(1);tile(p0,4);sparse(ell,4)",
           "fuse(all);parallel(2);reorder(p0,p1);sparse(csr);tile(p0,2);tile(p1,32)",
           "fuse(all);parallel(2);reorder(p0,p1);sparse(csr,4);tile(p1,32)")
CUDA_RECIPES = ("fuse(all);reduce(block);sparse(csr)", "fuse(none);reduce(warp);sparse(csr,4)",
                "fuse(all);reduce(thread);sparse(csr,2)", "fuse(none);reduce(warp);sparse(ell,4)",
                "fuse(none);reduce(thread);sparse(ell,2)", "fuse(none);row_depth(1);sparse(ell,2)",
                "fuse(none);row_depth(1);reduce(warp);sparse(csr,4)")


def _gcn_sparse() -> list:
    return [s for s in partition(zoo.load("gcn-n64-f16-d0.05")) if s.kind.value == "sparse"]


def _skewed(rows: int = 12, k: int = 10, n: int = 7):  # type: ignore[no-untyped-def]
    """A hand-built spmm (n columns, not a multiple of any width) and a CSR with empty rows and skewed degrees."""
    degrees = np.array([0, 10, 1, 0, 3, 9, 0, 2, 5, 10, 0, 1])[:rows]
    indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64)
    rng = np.random.default_rng(0)
    indices = np.concatenate([np.sort(rng.choice(k, d, replace=False)) for d in degrees]).astype(np.int64)
    nnz = int(indptr[-1])
    graph = single("spmm", [("ip", (rows + 1,), "int64"), ("ix", (nnz,), "int64"), ("v", (nnz,), "float32"),
                            ("d", (k, n), "float32")], (rows, n), rows=rows)
    values = {"ip": indptr, "ix": indices, "v": rng.standard_normal(nnz).astype(np.float32).astype(np.float64),
              "d": rng.standard_normal((k, n)).astype(np.float32).astype(np.float64)}
    return graph, values


def _task(graph, values) -> Task:  # type: ignore[no-untyped-def]
    program = lower(graph)
    sig = signature(program, compute_dtype(program))
    reference = evaluate(program, values)
    problem = Problem({sig.names[n]: values[n] for n in program.inputs},
                      {sig.names[n]: reference[n] for n in program.outputs}, tolerances(program, sig.names, values))
    return Task("skewed", "sparse", graph, program, problem)


def test_spaces_offer_the_formats_on_spmm_only() -> None:
    program = lower(_gcn_sparse()[1].graph)
    cpu = [g for g in RecipeSpace(program, "cpu").dims if g[0].name == "sparse"]
    gpu = [g for g in RecipeSpace(program, "cuda").dims if g[0].name == "sparse"]
    assert [str(s) for s in cpu[0]] == ["sparse(csr)", "sparse(csr,4)", "sparse(csr,8)", "sparse(ell,4)",
                                        "sparse(ell,8)"]
    assert [str(s) for s in gpu[0]][:5] == ["sparse(csr)", "sparse(csr,2)", "sparse(csr,4)", "sparse(ell,2)",
                                            "sparse(ell,4)"]  # then sparse(merge,C,V): tests/transforms/test_spmm.py
    dense = lower(single("matmul", [("a", (4, 8), "float32"), ("b", (8, 4), "float32")], (4, 4)))
    assert not any(g[0].name == "sparse" for g in RecipeSpace(dense, "cpu").dims)


@pytest.mark.parametrize("bad", ["sparse(coo)", "sparse(ell,0)", "sparse(csr,p0)", "sparse()"])
def test_bad_steps_are_schedule_errors(bad: str) -> None:
    with pytest.raises(ScheduleError):
        apply_recipe(parse(bad), lower(_gcn_sparse()[1].graph))


def test_formats_change_the_generated_c() -> None:
    program = lower(_gcn_sparse()[1].graph)
    code = {r: generate(apply_recipe(parse(r), program), "cpu").code for r in RECIPES[:4]}
    assert "acc" in code[RECIPES[0]] and "+= 4)" not in code[RECIPES[0]]
    assert "i2 += 4)" in code[RECIPES[1]] and "acc4[4]" in code[RECIPES[1]]  # 4 columns per nonzero read
    assert "simdlen(4) reduction(+:" in code[RECIPES[3]] and "? " in code[RECIPES[3]]


def test_cpu_formats_validate_on_the_gcn_and_a_skewed_csr(tmp_path: Path) -> None:
    with Worker() as worker:
        for sub in _gcn_sparse():
            results = measure(sub.graph, RECIPES, tmp_path, worker)
            assert [(r, res.error) for r, res in zip(RECIPES, results, strict=True) if not res.ok] == []
        ev = evaluator(_task(*_skewed()), backend="cpu", cache_dir=tmp_path, worker=worker, repeats=1, jobs=2)
        results = ev([parse(r) for r in RECIPES])
        assert [(r, res.error) for r, res in zip(RECIPES, results, strict=True) if not res.ok] == []


def test_a_wrong_kernel_fails_validation(tmp_path: Path) -> None:
    """The skewed problem catches a kernel that drops the last nonzero of each row."""
    graph, values = _skewed()
    values = {**values, "ip": np.concatenate([[0], values["ip"][1:] - (values["ip"][1:] > 0)])}  # shifted bounds
    task = _task(graph, _skewed()[1])
    wrong = Task(task.name, task.kind, task.graph, task.program,
                 Problem({**task.problem.inputs, "b0": values["ip"]}, task.problem.reference, task.problem.tolerance))
    with Worker() as worker:
        (res,) = evaluator(wrong, backend="cpu", cache_dir=tmp_path, worker=worker, repeats=1, jobs=1)(
            [parse(RECIPES[3])])
    assert not res.ok


@pytest.mark.skipif(not cuda.available(), reason="no NVRTC or nvcc")
def test_cuda_formats_compile_to_ptx(tmp_path: Path) -> None:
    programs = [lower(s.graph) for s in _gcn_sparse()] + [lower(_skewed()[0])]
    sources, labels = [], []
    for program in programs:
        for recipe in CUDA_RECIPES:
            sources.append(Source(generate(apply_recipe(parse(recipe), program), "cuda").code, "cuda"))
            labels.append(f"{program.name} {recipe}")
    results = build(sources, cache_dir=tmp_path)
    assert [(label, r.error[:300]) for label, r in zip(labels, results, strict=True) if not r.ok] == []
    ell = generate(apply_recipe(parse(CUDA_RECIPES[3]), programs[1]), "cuda").code
    assert "e5 += 128)" in ell  # 32 lanes x 4 nonzeros per chunk


def test_tolerance_widens_with_the_longest_csr_row_not_the_mean() -> None:
    graph, values = _skewed()
    program = lower(graph)
    names = signature(program, compute_dtype(program)).names
    (mean_based,) = tolerances(program, names).values()
    hub = dict(values, ip=np.array([0] + [1024] * 12, dtype=np.int64))  # one row of 1024 terms, the rest empty
    (hub_based,) = tolerances(program, names, hub).values()
    assert mean_based == TOLERANCE["float32"]  # mean degree ~4: no widening
    assert hub_based == TOLERANCE["float32"] * 8  # sqrt(1024) / 4
