"""The ``stage`` step: where it is offered, how it checks its arguments, the staged kernels' shape, PTX for several
shapes (no GPU needed), and (gpu-marked) validation against the float64 reference."""

from collections.abc import Sequence
from pathlib import Path

import pytest

from embed.builder import GraphBuilder
from embed.ir import Graph
from embed.lower import lower
from tests.gpu import needs_gpu
from tests.transforms.kernels import single
from transforms.build import Source, build
from transforms.codegen import generate
from transforms.codegen.cuda_stage import stage_plan
from transforms.compilers import cuda
from transforms.recipe import parse
from transforms.schedule import ScheduleError
from transforms.space import RecipeSpace, default_recipe
from transforms.transformation import apply_recipe


def transpose(shape: Sequence[int], perm: Sequence[int], dtype: str = "float32") -> Graph:
    return single("transpose", [("x", shape, dtype)], [shape[i] for i in perm], dtype, perm=list(perm))


def transpose_add(n: int, m: int) -> Graph:
    b = GraphBuilder("transpose_add")
    x, y = b.input("x", (n, m), "float32"), b.input("y", (m, n), "float32")
    t = b.node("transpose", [x], (m, n), "float32", perm=[1, 0])
    return b.build([b.node("add", [t, y], (m, n), "float32", name="out")])


def _shapes(program) -> dict:  # type: ignore[no-untyped-def]
    return {n: b.shape for n, b in program.buffers.items()}


def test_only_loads_strided_along_p0_with_a_contiguous_dim_qualify() -> None:
    program = lower(transpose((2, 3, 37, 20), (0, 3, 1, 2)))  # out[a, d, b, c] = x[a, b, c, d]: q is x's last dim
    (nest,) = program.nests
    plan = stage_plan(nest, _shapes(program))
    assert plan is not None and plan.q == "p2" and [a.tensor for a in plan.loads] == ["x"]
    copy = lower(transpose((2, 3, 37, 20), (1, 0, 2, 3)))  # the last dim stays last: loads already coalesced
    assert [stage_plan(n, _shapes(copy)) for n in copy.nests] == [None]
    add = lower(single("add", [("x", (8, 9), "float32"), ("y", (9,), "float32")], (8, 9)))  # broadcast: stride 0
    assert [stage_plan(n, _shapes(add)) for n in add.nests] == [None]


def test_the_step_is_offered_for_transposes_only_and_off_by_default() -> None:
    program = lower(transpose((64, 32), (1, 0)))
    (dim,) = [d for d in RecipeSpace(program, "cuda").dims if d[0].name == "stage"]
    assert [str(s) for s in dim[:3]] == ["stage(0)", "stage(32,4)", "stage(32,8)"]
    assert "stage(64,1)" not in map(str, dim) and "stage(16,1)" in map(str, dim)  # 4096 threads: too many
    assert "stage(0)" in str(default_recipe(program, "cuda"))
    assert all(d[0].name != "stage" for d in RecipeSpace(program, "cpu").dims)
    copy = lower(single("relu", [("x", (64, 32), "float32")], (64, 32)))
    assert all(d[0].name != "stage" for d in RecipeSpace(copy, "cuda").dims)
    f64 = lower(transpose((64, 32), (1, 0), "float64"))  # 64 x 65 doubles fit in 48 KiB
    assert "stage(64,4)" in [str(s) for d in RecipeSpace(f64, "cuda").dims for s in d]


@pytest.mark.parametrize("bad", ["stage(24,4)", "stage(32,3)", "stage(64,1)", "stage(16,16)", "stage(0,4)",
                                 "stage(32,4,1)", "stage(a)"])
def test_bad_arguments_are_schedule_errors(bad: str) -> None:
    with pytest.raises(ScheduleError, match="stage"):
        apply_recipe(parse(bad), lower(transpose((8, 8), (1, 0))))


def test_staged_kernel_tiles_and_launch_shape() -> None:
    program = lower(transpose((3, 50, 70), (0, 2, 1), "float16"))
    kernel = generate(apply_recipe(parse("fuse(all);stage(32,4)"), program), "cuda")
    (launch,) = kernel.launches
    assert (launch.grid, launch.block) == ((2 * 3 * 3, 1, 1), (256, 1, 1))  # ceil(50/32) x ceil(70/32) x batch 3
    code = kernel.code.split("tb_kernel0")[1]
    assert code.count("__shared__ float k_tile") == 1 and "[32][33]" in code and code.count("__syncthreads") == 1
    assert "[ty + e" in code and "][tx]" in code and "[tx][ty + e" in code  # written by rows, read by columns
    plain = generate(apply_recipe(parse("fuse(all);stage(0)"), program), "cuda").code
    assert "__shared__" not in plain
    double = generate(apply_recipe(parse("stage(64,4)"), lower(transpose((5, 33, 17), (2, 1, 0), "float64"))), "cuda")
    assert "__shared__ double" in double.code and "[64][65]" in double.code
    assert double.launches[0].block == (1024, 1, 1)


CASES = [  # (graph, recipe): non-multiples of the tile, batched permutes, every dtype path
    (transpose((70, 45), (1, 0)), "stage(32,4)"),
    (transpose((70, 45), (1, 0)), "stage(16,1)"),
    (transpose((3, 50, 70), (0, 2, 1), "float16"), "stage(64,8)"),
    (transpose((2, 3, 37, 20), (0, 3, 1, 2)), "stage(32,8)"),
    (transpose((5, 33, 17), (2, 1, 0), "float64"), "stage(64,4)"),
    (transpose((64, 128), (1, 0), "bfloat16"), "stage(16,2)"),
    (transpose_add(40, 24), "fuse(none);stage(32,4)"),
]


@pytest.mark.skipif(not cuda.available(), reason="no NVRTC or nvcc")
def test_staged_kernels_compile_to_ptx(tmp_path: Path) -> None:
    kernels = [generate(apply_recipe(parse(recipe), lower(graph)), "cuda") for graph, recipe in CASES]
    results = build([Source(k.code, "cuda") for k in kernels], cache_dir=tmp_path)
    assert [(recipe, r.error[:400]) for (_, recipe), r in zip(CASES, results, strict=True) if not r.ok] == []
    for (_, recipe), r in zip(CASES, results, strict=True):
        ptx = Path(r.artifact).read_text()
        assert ".shared" in ptx and "bar.sync" in ptx, recipe


@needs_gpu
@pytest.mark.parametrize("case", range(len(CASES)))
def test_staged_kernels_validate_on_the_gpu(tmp_path: Path, case: int) -> None:
    from tests.transforms.kernels import measure

    graph, recipe = CASES[case]
    (result,) = measure(graph, [recipe], tmp_path, backend="cuda")
    assert result.ok, result.error
    assert 0 < result.median_s < 1e-3
