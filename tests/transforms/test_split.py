"""reduce(split,S): rows cut across blocks (transforms.codegen.cuda_split): launches, offered space, PTX, GPU runs."""

import math
import re
from pathlib import Path

import pytest

from embed.builder import GraphBuilder
from embed.ir import DType, Graph
from embed.lower import lower
from tests.gpu import needs_gpu
from tests.transforms.kernels import single
from transforms.adapt import adapt
from transforms.build import Source, build
from transforms.codegen import generate
from transforms.compilers import cuda
from transforms.recipe import parse
from transforms.run import quantize
from transforms.schedule import ScheduleError
from transforms.space import RecipeSpace, default_recipe
from transforms.transformation import apply_recipe
from transforms.tune import make_task
from transforms.worker import check


def _softmax(rows: int, cols: int, dtype: str = "float16") -> Graph:
    return single("softmax", [("x", (rows, cols), dtype)], (rows, cols), dtype, axis=-1)


def _layernorm(rows: int, cols: int, add: bool = False) -> Graph:
    b = GraphBuilder("ln")
    x, w = b.input("x", (rows, cols), "float16"), b.input("w", (cols,), "float16")
    bias = b.input("b", (cols,), "float16")
    if add:
        x = b.node("add", [x, b.input("r", (rows, cols), "float16")], (rows, cols), "float16")
    return b.build([b.node("layer_norm", [x, w, bias], (rows, cols), "float16", name="out", axes=[1], eps=1e-5)])


def _cross_entropy(rows: int, classes: int) -> Graph:
    b = GraphBuilder("ce")
    logits, target = b.input("logits", (rows, classes), "float32"), b.input("target", (rows,), "int64")
    logp = b.node("log_softmax", [logits], (rows, classes), "float32", axis=1)
    return b.build([b.node("nll_loss", [logp, target], (), "float32", name="out", reduction="mean")])


def _sum(n: int) -> Graph:
    return single("reduce_sum", [("x", (n,), "float32")], (), "float32", axes=[0])


def _mean(rows: int, cols: int) -> Graph:
    return single("reduce_mean", [("x", (rows, cols), "float32")], (rows,), "float32", axes=[1])


def _expected_x_log_softmax(rows: int, cols: int) -> Graph:
    """sum(softmax(x) * x) per row: a reduction that reads the normalised row, so three launches."""
    b = GraphBuilder("ent")
    x = b.input("x", (rows, cols), "float32")
    y = b.node("softmax", [x], (rows, cols), "float32", axis=-1)
    z = b.node("mul", [y, x], (rows, cols), "float32")
    return b.build([b.node("reduce_sum", [z], (rows,), "float32", name="out", axes=[1])])


def _kernel(graph: Graph, recipe: str):  # type: ignore[no-untyped-def]
    return generate(apply_recipe(parse(recipe), lower(graph)), "cuda")


def _splits(graph: Graph, backend: str = "cuda") -> list[int]:
    space = RecipeSpace(lower(graph), backend)
    return [s.args[1] for d in space.dims for s in d if s.name == "reduce" and s.args[0] == "split"]


def test_softmax_takes_a_launch_of_partials_and_one_that_merges_and_normalises() -> None:
    kernel = _kernel(_softmax(8, 128256), "fuse(all);threads(256);reduce(split,16);vectorize(8)")
    part, last = kernel.launches
    assert (part.entry, part.grid, last.entry, last.grid) == ("tb_kernel0_0", (128, 1, 1), "tb_kernel0", (128, 1, 1))
    (scratch,) = [b for b in part.buffers if b.shape == (2 * 8 * 16,)]  # (max, sum) of 16 parts of 8 rows
    assert scratch.kind == "scratch" and scratch.dtype == "float32" and last.args == part.args
    bodies = dict(re.findall(r"void __launch_bounds__\(\d+\) (\w+)\((.*?)\n}\n", kernel.code, re.S))
    assert "k_online(m" in bodies["tb_kernel0_0"] and "b0[" not in bodies["tb_kernel0_0"].split("__syncthreads")[-1]
    assert re.search(r"if \(tid == 0\) \{ b4\[0 \+ row \* 16 \+ k_split\] = m\d+; b4\[128 \+ row \* 16 \+ k_split\]",
                     bodies["tb_kernel0_0"])
    assert re.search(r"for \(int (p\d+) = \(int\)\(tid % 32\); \1 < 16; \1 \+= 32\) \{ const float y\d+ = "
                     r"b4\[0 \+ row \* 16 \+ \1\]; .* k_online\(", bodies["tb_kernel0"])
    for body in bodies.values():  # each launch reads its part of x once, as 16-byte words
        assert body.count("(const uint4*)((const char*)(b0") == 1 and "(idx_t)k_split * 8192 +" in body
    assert "atomic" not in kernel.code
    wide = _kernel(_softmax(8, 128256), "fuse(all);threads(256);reduce(split,64);vectorize(8)")
    assert [x.grid for x in wide.launches] == [(8 * 63, 1, 1)] * 2  # 63 chunks of 2048: at most 63 parts, none empty


def test_layernorm_merges_welford_partials_and_a_sum_ends_with_a_merging_warp() -> None:
    ln = _kernel(_layernorm(8, 65536), "fuse(all);threads(512);reduce(split,16);vectorize(8)")
    assert [x.grid for x in ln.launches] == [(128, 1, 1)] * 2 and ln.code.count("k_welford(a") == 6  # loop, 5 shuffles
    assert any(b.shape == (3 * 8 * 16,) for b in ln.launches[0].buffers)  # count, mean, M2
    total = _kernel(_sum(10_000_000), "reduce(split,256)")  # 256 threads x 4 floats a chunk: 251 parts of 39 chunks
    part, merge = total.launches
    assert (part.grid, part.block, merge.grid, merge.block) == ((251, 1, 1), (256, 1, 1), (1, 1, 1), (32, 1, 1))
    assert "if (valid && lane == 0 && k_split == 0) { b1[0] = r" in total.code


def test_a_reduction_of_normalised_values_takes_a_third_launch() -> None:
    kernel = _kernel(_expected_x_log_softmax(8, 100000), "fuse(all);threads(256);reduce(split,16);vectorize(1)")
    assert [(x.entry, x.grid[0], x.block[0]) for x in kernel.launches] == [
        ("tb_kernel0_0", 128, 256), ("tb_kernel0_1", 128, 256), ("tb_kernel0", 8, 32)]
    middle = kernel.code.split("tb_kernel0_1(")[1]
    assert "k_online(a" in middle and "b6[256 + row * 16 + k_split] = acc" in middle  # merge, normalise, partial sums


def test_rows_of_one_chunk_run_as_under_reduce_block() -> None:
    graph = _softmax(64, 1000)
    block = _kernel(graph, "fuse(all);threads(256);reduce(block);row_mode(registers);vectorize(8)")
    split = _kernel(graph, "fuse(all);threads(256);reduce(split,16);row_mode(registers);vectorize(8)")
    assert (split.code, split.launches) == (block.code, block.launches)


def test_split_is_offered_for_few_long_rows_only() -> None:
    assert _splits(_softmax(8, 128256)) == [16, 64]  # 128 and 512 blocks
    assert _splits(_cross_entropy(16, 128256)) == [16, 64]
    assert _splits(_sum(10_000_000)) == [256, 1024]
    assert _splits(_softmax(4096, 4096)) == [] and _splits(_softmax(8, 2048)) == []  # many rows; short rows
    assert _splits(_softmax(8, 128256), "cpu") == []


def test_the_default_recipe_splits_few_long_rows_enough_to_give_every_sm_a_block() -> None:
    def reduce_step(graph: Graph) -> str:
        return next(str(s) for s in default_recipe(lower(graph), "cuda") if s.name == "reduce")

    assert reduce_step(_softmax(8, 128256)) == "reduce(split,64)"  # 8 x 16 blocks would leave SMs idle
    assert reduce_step(_cross_entropy(16, 128256)) == "reduce(split,16)"  # the log-softmax rows, not the mean's one
    assert reduce_step(_softmax(256, 8192)) == "reduce(block)"  # split offered, but a block per row fills the GPU
    assert reduce_step(_softmax(8, 1024)) == "reduce(block)"  # short rows: no split offered
    assert next(s for s in default_recipe(lower(_softmax(8, 128256)), "cpu") if s.name == "reduce").args[0] != "split"


def test_split_is_refused_where_a_row_is_not_one_inner_dim() -> None:
    graph = single("reduce_mean", [("x", (2, 512, 512), "float32")], (2,), "float32", axes=[1, 2])
    assert _splits(graph) == []
    with pytest.raises(ScheduleError, match=r"reduce\(split\): reduce_mean is not a row reduction"):
        _kernel(graph, "reduce(split,64)")
    b = GraphBuilder("spmm")
    indptr, indices = b.input("indptr", (65,), "int64"), b.input("indices", (640,), "int64")
    values, dense = b.input("values", (640,), "float32"), b.input("dense", (64, 16), "float32")
    spmm = b.build([b.node("spmm", [indptr, indices, values, dense], (64, 16), "float32", name="out", rows=64)])
    with pytest.raises(ScheduleError, match="not a row reduction"):
        _kernel(spmm, "reduce(split,4)")
    for bad in ("reduce(split)", "reduce(split,3)"):
        with pytest.raises(ScheduleError, match="argument 2 must be one of"):
            apply_recipe(parse(bad), lower(_softmax(8, 128256)))


def test_a_foreign_split_adapts_to_block_where_no_split_is_offered() -> None:
    assert str(adapt(parse("reduce(split,64)"), lower(_softmax(64, 1000)), "cuda")[0]) == "reduce(block)"
    assert str(adapt(parse("reduce(split,256)"), lower(_softmax(8, 128256)), "cuda")[0]) == "reduce(split,64)"


@pytest.mark.skipif(not cuda.available(), reason="no NVRTC or nvcc")
def test_split_kernels_compile_to_ptx(tmp_path: Path) -> None:
    cases = [(_softmax(8, 128256), "fuse(all);threads(256);reduce(split,16);vectorize(8);unroll(2)"),
             (_softmax(4, 100003), "fuse(none);threads(1024);reduce(split,64);vectorize(8)"),
             (_layernorm(8, 65536), "fuse(all);threads(512);reduce(split,64);vectorize(4)"),
             (_layernorm(4, 65536, add=True), "fuse(all);threads(128);reduce(split,16);vectorize(2)"),
             (_sum(10_000_003), "reduce(split,1024);threads(32)"),
             (_mean(4, 100003), "reduce(split,64)"),
             (_cross_entropy(16, 128256), "fuse(all);threads(256);reduce(split,16);vectorize(4);inline(gather)"),
             (_expected_x_log_softmax(8, 100000), "fuse(all);threads(64);reduce(split,4);vectorize(4)")]
    kernels = [_kernel(g, r) for g, r in cases]
    results = build([Source(k.code, "cuda") for k in kernels], cache_dir=tmp_path)
    assert [(r, x.error[:300]) for (_, r), x in zip(cases, results, strict=True) if not x.ok] == []
    assert all(f".entry {launch.entry}(" in Path(x.artifact).read_text()
               for k, x in zip(kernels, results, strict=True) for launch in k.launches)


GPU_CASES = {
    "softmax": (_softmax(8, 128256), ["fuse(all);threads(256);reduce(split,16);vectorize(8)",
                                      "fuse(all);threads(1024);reduce(split,64);vectorize(8);unroll(2)"]),
    "softmax-odd": (_softmax(8, 100003), ["fuse(all);threads(256);reduce(split,16);vectorize(8)"]),  # scalar words
    "softmax-2": (_softmax(8, 65538), ["fuse(none);threads(512);reduce(split,64);vectorize(8)"]),  # 2-half words
    "layernorm": (_layernorm(8, 65536), ["fuse(all);threads(512);reduce(split,16);vectorize(8)"]),
    "layernorm-odd": (_layernorm(4, 50001), ["fuse(all);threads(256);reduce(split,64);vectorize(4)"]),
    "add-layernorm": (_layernorm(4, 65536, add=True), ["fuse(all);reduce(split,16);vectorize(8)",
                                                       "fuse(none);threads(128);reduce(split,64);vectorize(4)"]),
    "cross-entropy": (_cross_entropy(16, 128256), ["fuse(all);reduce(split,16);vectorize(4);inline(gather)",
                                                   "fuse(all);threads(512);reduce(split,64);vectorize(4)"]),
    "mean": (_mean(4, 100003), ["reduce(split,64);threads(128)"]),
    "softmax-dot": (_expected_x_log_softmax(8, 100000), ["fuse(all);threads(256);reduce(split,16);vectorize(4)"]),
}


@needs_gpu
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_split_kernels_validate_on_the_gpu(tmp_path: Path, case: str) -> None:
    from tests.transforms.kernels import measure

    graph, recipes = GPU_CASES[case]
    results = measure(graph, recipes, tmp_path, backend="cuda")
    assert [(r, x.error_kind, x.error[:200]) for r, x in zip(recipes, results, strict=True) if not x.ok] == []
    # far tighter than the validation's tolerance: a half output within twice its own rounding, a float one 1e-4
    bound = 2 * _rounding_error(graph) + 1e-3 if graph.tensors[graph.outputs[0]].dtype == DType.FLOAT16 else 1e-4
    assert [x.max_rel_err for x in results if x.max_rel_err is None or x.max_rel_err > bound] == []


def _rounding_error(graph: Graph) -> float:
    """The relative error of the float64 reference rounded to float16: what an exact half kernel still shows
    (up to 0.06 for softmax rows of 10^5, whose values are near the smallest normal halves)."""
    (reference,) = make_task(graph).problem.reference.values()
    error = check(quantize(reference, "float16"), reference, math.inf)[1]
    assert error is not None
    return error


@needs_gpu
def test_a_split_sum_of_ten_million_is_accurate_and_deterministic(tmp_path: Path) -> None:
    from tests.transforms.kernels import measure

    recipes = ["reduce(split,256);threads(256)"] * 2 + ["reduce(split,1024);threads(1024)"]
    results = measure(_sum(10_000_003), recipes, tmp_path, backend="cuda")
    assert [(k, r, x.error) for k, (r, x) in enumerate(zip(recipes, results, strict=True)) if not x.ok] == []
    assert all(x.max_rel_err is not None and x.max_rel_err < 1e-4 for x in results)
    assert results[0].max_rel_err == results[1].max_rel_err  # the same merge order on every run
