"""``sparse(merge,C,V)``: SpMM split into equal chunks of nonzeros (``transforms.codegen.cuda_spmm``).

The gpu tests run on a power-law CSR with empty rows (first, middle, last), hub rows longer than every chunk tested
and rows cut by chunk boundaries, with 67 columns (a multiple of no lane count); ``test_the_skewed_csr_...`` checks
those properties here, so that a kernel that stores cut rows without atomics, or skips zeroing, cannot pass."""

from pathlib import Path

import numpy as np
import pytest

from embed import zoo
from embed.builder import GraphBuilder
from embed.ir import Graph
from embed.lower import lower
from embed.partition import partition
from tests.gpu import needs_gpu
from tests.transforms.kernels import measure
from transforms.build import Source, build
from transforms.codegen import Kernel, generate
from transforms.codegen.cuda_spmm import match_sparse_product
from transforms.codegen.kernel import compute_dtype
from transforms.codegen.signature import signature
from transforms.compilers import cuda
from transforms.problem import tolerances
from transforms.recipe import parse
from transforms.run import Problem, Trial, Worker, run
from transforms.schedule import ScheduleError
from transforms.space import RecipeSpace
from transforms.transformation import apply_recipe
from transforms.tune import Task, evaluator

COLS = 67
GPU_RECIPES = ("sparse(merge,256,2);threads(128)", "sparse(merge,1024);threads(256)", "sparse(merge,7,4);threads(64)",
               "sparse(merge,256,8);threads(32)", "sparse(merge,64,64);threads(1024)")
CHUNKS = (7, 64, 256, 1024)  # every chunk of GPU_RECIPES


def _gcn_sparse() -> list[Graph]:
    return [s.graph for s in partition(zoo.load("gcn-n64-f16-d0.05")) if s.kind.value == "sparse"]


def _spmm(rows: int, nnz: int, cols: int = COLS, *, itype: str = "int32", dtype: str = "float32",
          epilogue: bool = False) -> Graph:
    """``out = A @ dense`` for a ``rows x rows`` CSR, or ``relu(A @ dense + bias)`` with ``epilogue``."""
    b = GraphBuilder("spmm")
    ip, ix = b.input("ip", (rows + 1,), itype), b.input("ix", (nnz,), itype)
    v, d = b.input("v", (nnz,), dtype), b.input("d", (rows, cols), dtype)
    out = b.node("spmm", [ip, ix, v, d], (rows, cols), dtype, name="s" if epilogue else "out", rows=rows)
    if epilogue:
        added = b.node("add", [out, b.input("bias", (cols,), dtype)], (rows, cols), dtype)
        out = b.node("relu", [added], (rows, cols), dtype, name="out")
    return b.build([out])


def _skewed_csr(rows: int = 3001, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, indices): Pareto degrees, 15% of the rows empty (the first two and the last too), three hub rows
    of 2000-3000 nonzeros; distinct sorted columns per row."""
    rng = np.random.default_rng(seed)
    degrees = np.minimum(np.round(rng.pareto(1.2, rows) * 3), 400).astype(np.int64)
    degrees[rng.random(rows) < 0.15] = 0
    degrees[[0, 1, rows - 1]] = 0
    degrees[[5, rows // 2, rows - 3]] = (2000, 3000, 2500)
    indices = np.concatenate([np.sort(rng.choice(rows, d, replace=False)) for d in degrees])
    return np.concatenate([[0], np.cumsum(degrees)]), indices


def _skewed_task(*, itype: str = "int32", dtype: str = "float32", epilogue: bool = False) -> Task:
    """The skewed CSR's product as a Task whose Problem holds a float64 reference computed here."""
    indptr, indices = _skewed_csr()
    rows, nnz = len(indptr) - 1, len(indices)
    graph = _spmm(rows, nnz, itype=itype, dtype=dtype, epilogue=epilogue)
    program = lower(graph)
    rng = np.random.default_rng(1)
    values = {"ip": indptr.astype(itype), "ix": indices.astype(itype), "v": rng.standard_normal(nnz).astype(dtype),
              "d": rng.standard_normal((rows, COLS)).astype(dtype), "bias": rng.standard_normal(COLS).astype(dtype)}
    dense = values["d"].astype(np.float64)
    ref = np.stack([values["v"][a:b].astype(np.float64) @ dense[indices[a:b]]
                    for a, b in zip(indptr[:-1], indptr[1:], strict=True)])
    if epilogue:
        ref = np.maximum(ref + values["bias"], 0)
    names = signature(program, compute_dtype(program)).names
    problem = Problem({names[n]: values[n] for n in program.inputs}, {names["out"]: ref},
                      tolerances(program, names, values))
    return Task("skewed", "sparse", graph, program, problem)


def test_merge_steps_round_trip_and_set_the_knobs() -> None:
    program = lower(_spmm(10, 30))
    for text, knobs in (("sparse(merge,256,2)", (("merge", 2), 256)), ("sparse(merge,1024)", (("merge", 1), 1024)),
                        ("sparse(csr,4)", (("csr", 4), 0))):
        assert str(parse(text)) == text
        schedule = apply_recipe(parse(text), program)
        assert (schedule.sparse, schedule.chunk) == knobs


@pytest.mark.parametrize("bad", ["sparse(merge)", "sparse(merge,0)", "sparse(merge,256,0)", "sparse(merge,p0)",
                                 "sparse(merge,256,2,1)", "sparse(csr,4,2)"])
def test_bad_merge_steps_are_schedule_errors(bad: str) -> None:
    with pytest.raises(ScheduleError):
        apply_recipe(parse(bad), lower(_spmm(10, 30)))


def test_merge_is_offered_on_cuda_for_csr_products_only() -> None:
    for graph in _gcn_sparse():
        program = lower(graph)
        (gpu,) = [g for g in RecipeSpace(program, "cuda").dims if g[0].name == "sparse"]
        (cpu,) = [g for g in RecipeSpace(program, "cpu").dims if g[0].name == "sparse"]
        assert [str(s) for s in gpu if "merge" in str(s)] == [
            "sparse(merge,256)", "sparse(merge,256,2)", "sparse(merge,256,4)", "sparse(merge,1024)",
            "sparse(merge,1024,2)", "sparse(merge,1024,4)"]
        assert not any("merge" in str(s) for s in cpu)
    half = lower(_spmm(10, 30, dtype="float16"))  # fp16 sums cannot be atomically added in place
    assert match_sparse_product(half) is None
    assert not any("merge" in str(s) for g in RecipeSpace(half, "cuda").dims for s in g)
    with pytest.raises(ScheduleError):
        generate(apply_recipe(parse("sparse(merge,256)"), half), "cuda")


def test_launches_zero_then_merge_then_finish_the_epilogue() -> None:
    plain = generate(apply_recipe(parse("sparse(merge,256,2);threads(128)"), lower(_spmm(1000, 8000, 64))), "cuda")
    assert [(x.entry, x.grid[0], x.block[0]) for x in plain.launches] == [
        ("tb_spmm_zero", 4, 256), ("tb_spmm", 8, 128)]  # 32 chunks of 256, one warp each (64 columns = 32 x 2)
    relu = generate(apply_recipe(parse("sparse(merge,256,4);threads(128)"), lower(_spmm(1000, 8000, 64,
                                                                                           epilogue=True))), "cuda")
    assert [(x.entry, x.grid[0]) for x in relu.launches] == [
        ("tb_spmm_zero", 4), ("tb_spmm", 4), ("tb_spmm_finish", 4)]  # 16 lanes x 4 columns: two chunks per warp
    assert "k_relu" in relu.code and "atomicAdd" in relu.code
    wide = generate(apply_recipe(parse("sparse(merge,256);threads(256)"), lower(_spmm(1000, 8000, 130))), "cuda")
    assert wide.launches[1].grid[0] == 20  # 32 chunks x 5 column tiles of 32, 8 groups per block


@pytest.mark.skipif(not cuda.available(), reason="no NVRTC or nvcc")
def test_merge_kernels_compile_to_ptx(tmp_path: Path) -> None:
    programs = [lower(g) for g in (*_gcn_sparse(), _spmm(3001, 9000), _spmm(500, 4000, 7, itype="int64",
                                                                            dtype="float64", epilogue=True))]
    recipes = [*GPU_RECIPES, "sparse(merge,1024,4);threads(512)", "sparse(merge,128,3)"]
    kernels = [(f"{p.name} {r}", generate(apply_recipe(parse(r), p), "cuda")) for p in programs for r in recipes]
    results = build([Source(k.code, "cuda") for _, k in kernels], cache_dir=tmp_path)
    assert [(label, r.error[:300]) for (label, _), r in zip(kernels, results, strict=True) if not r.ok] == []
    for (label, kernel), result in zip(kernels, results, strict=True):
        ptx = Path(result.artifact).read_text()
        assert all(f".entry {x.entry}(" in ptx for x in kernel.launches), label
        assert "atom.global.add.f" in ptx or "red.global.add.f" in ptx, label


def test_the_cpu_backend_walks_merge_rows_like_csr(tmp_path: Path) -> None:
    for graph in _gcn_sparse():
        program = lower(graph)
        merge = generate(apply_recipe(parse("fuse(all);parallel(1);sparse(merge,256,2)"), program), "cpu")
        assert merge.code == generate(apply_recipe(parse("fuse(all);parallel(1);sparse(csr)"), program), "cpu").code
        (result,) = measure(graph, ["fuse(all);parallel(1);sparse(merge,256,2)"], tmp_path)
        assert result.ok, result.error


def test_the_skewed_csr_has_hubs_empty_rows_and_cut_rows_at_every_chunk() -> None:
    indptr, _ = _skewed_csr()
    degrees = np.diff(indptr)
    assert degrees[0] == degrees[-1] == 0 and (degrees[1:-1] == 0).sum() > 100
    for chunk in CHUNKS:
        nonempty = degrees > 0
        cut = nonempty & (indptr[:-1] // chunk != (indptr[1:] - 1) // chunk)
        assert cut.sum() >= 10 and degrees.max() > 2 * chunk, chunk  # rows cut, a hub spans three chunks


@needs_gpu
@pytest.mark.parametrize("variant", [{}, {"epilogue": True, "itype": "int64"}, {"dtype": "float64"}])
def test_merge_validates_on_a_skewed_csr(tmp_path: Path, variant: dict) -> None:
    task = _skewed_task(**variant)
    with Worker() as worker:
        ev = evaluator(task, backend="cuda", cache_dir=tmp_path, worker=worker, repeats=1, jobs=2)
        results = ev([parse(r) for r in GPU_RECIPES])
    assert [(r, x.error[:300]) for r, x in zip(GPU_RECIPES, results, strict=True) if not x.ok] == []


@needs_gpu
def test_merge_validates_on_the_zoo_gcn(tmp_path: Path) -> None:
    with Worker() as worker:
        for graph in _gcn_sparse():  # random CSR inputs, int64 indices, with and without relu
            results = measure(graph, GPU_RECIPES, tmp_path, worker, backend="cuda")
            assert [(r, x.error[:300]) for r, x in zip(GPU_RECIPES, results, strict=True) if not x.ok] == []


@needs_gpu
def test_a_merge_kernel_without_atomics_or_zeroing_fails(tmp_path: Path) -> None:
    task = _skewed_task()
    for recipe in ("sparse(merge,256,2);threads(128)", "sparse(merge,1024);threads(256)"):
        kernel = generate(apply_recipe(parse(recipe), task.program), "cuda")
        assert "atomicAdd(p, v)" in kernel.code
        stores = Kernel("cuda", kernel.code.replace("atomicAdd(p, v)", "*p = v"), kernel.launches)
        variants = {"right": kernel, "plain stores": stores, "no zeroing": Kernel("cuda", kernel.code,
                                                                                  kernel.launches[1:])}
        builds = build([Source(k.code, "cuda") for k in variants.values()], cache_dir=tmp_path)
        results = run([Trial(b, k.launches, task.problem) for b, k in zip(builds, variants.values(), strict=True)],
                      repeats=1)
        assert [x.ok for x in results] == [True, False, False], [(x.error_kind, x.max_rel_err) for x in results]
