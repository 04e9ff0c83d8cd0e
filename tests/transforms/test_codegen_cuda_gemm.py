"""The gemm step: contraction matching, legal configurations, PTX for several tiles and odd shapes, and
(gpu-marked) validation of every path against the float64 reference."""

from pathlib import Path

import pytest

from embed.builder import GraphBuilder
from embed.ir import Graph
from embed.lower import lower
from tests.gpu import needs_gpu
from tests.transforms.kernels import single
from transforms.build import Source, build
from transforms.codegen import generate
from transforms.compilers import cuda
from transforms.contraction import GemmConfig, gemm_configs, match_contraction
from transforms.recipe import parse
from transforms.schedule import ScheduleError
from transforms.space import RecipeSpace, default_recipe
from transforms.transformation import apply_recipe


def linear(m: int, k: int, n: int, dtype: str = "float16", *, transpose_b: bool = False, batch: tuple[int, ...] = (),
           act: str = "gelu", residual: bool = False) -> Graph:
    """x[batch.., m, k] @ w (+ bias, activation, residual); w is [n, k] with transpose_b, else [k, n]."""
    b = GraphBuilder("linear")
    x = b.input("x", (*batch, m, k), dtype)
    w = b.param("w", (n, k) if transpose_b else (k, n), dtype)
    out = (*batch, m, n)
    y = b.node("matmul", [x, w], out, dtype, transpose_b=transpose_b)
    y = b.node("add", [y, b.param("bias", (n,), dtype)], out, dtype)
    y = b.node(act, [y], out, dtype, **({"approximate": "none"} if act == "gelu" else {}))
    if residual:
        y = b.node("add", [y, b.input("r", out, dtype)], out, dtype)
    return b.build([b.node("mul", [y, b.const(0.5, dtype)], out, dtype, name="out")])


def bmm(batch: int, m: int, k: int, n: int, dtype: str) -> Graph:
    return single("matmul", [("a", (batch, m, k), dtype), ("b", (batch, k, n), dtype)], (batch, m, n), dtype)


def test_match_contraction_records_extents_strides_and_layout() -> None:
    c = match_contraction(lower(linear(64, 40, 48)))
    assert c is not None
    assert (c.batch, c.m, c.n, c.k, c.b_k_major, c.tensor_cores) == ((), 64, 48, 40, False, True)
    assert (c.a.outer, c.a.k, c.b.outer, c.b.k) == (40, 1, 1, 48)
    assert [n.op for n in c.epilogue] == ["add", "gelu", "mul"]
    t = match_contraction(lower(linear(8, 16, 24, "bfloat16", transpose_b=True, batch=(2, 3), residual=True)))
    assert t is not None and t.b_k_major and t.batch == (2, 3)
    assert (t.a.batch, t.b.batch, t.b.outer) == ((3 * 8 * 16, 8 * 16), (0, 0), 16)  # the weight is broadcast


def test_non_contractions_do_not_match() -> None:
    softmax = single("softmax", [("x", (8, 32), "float16")], (8, 32), "float16", axis=-1)
    b = GraphBuilder("mm_sum")
    y = b.node("matmul", [b.input("x", (8, 16), "float16"), b.param("w", (16, 24), "float16")], (8, 24), "float16")
    summed = b.build([b.node("reduce_sum", [y], (8,), "float16", name="out", axes=[1])])
    assert match_contraction(lower(softmax)) is None
    assert match_contraction(lower(summed)) is None
    assert RecipeSpace(lower(softmax), "cuda").dims and all(
        s.name != "gemm" for d in RecipeSpace(lower(softmax), "cuda").dims for s in d)


def test_configs_default_first_all_legal_vendor_last() -> None:
    half = match_contraction(lower(linear(64, 40, 48)))
    single_precision = match_contraction(lower(linear(64, 40, 48, "float32")))
    assert half is not None and single_precision is not None
    configs = gemm_configs(half)
    assert configs[0] == GemmConfig("mma", 128, 128, 32, 4, 3, 8) and configs[-1] == GemmConfig("cublas")
    assert all(g.legal(half) for g in configs) and {g.path for g in configs} == {"mma", "cublas"}
    assert {g.path for g in gemm_configs(single_precision)} == {"simt", "cublas"}
    assert not GemmConfig("mma", 128, 128, 32, 4, 3, 8).legal(single_precision)  # no fp32 tensor-core path
    assert not GemmConfig("mma", 256, 256, 64, 4, 4, 1).legal(half)  # too much shared memory
    assert not GemmConfig("mma", 48, 64, 32, 4, 3, 1).legal(half)  # warps do not tile the block
    assert GemmConfig("mma", 128, 128, 32, 4, 3, 8).shared_bytes(half) == 2 * 3 * (128 * 40 + 32 * 136)


def test_the_step_is_in_the_cuda_space_and_checks_its_arguments() -> None:
    program = lower(linear(64, 40, 48))
    assert "gemm(mma,128,128,32,4,3,8)" in str(default_recipe(program, "cuda"))
    assert apply_recipe(parse("gemm(mma,64,128,64,8,4,1)"), program).gemm == GemmConfig("mma", 64, 128, 64, 8, 4, 1)
    assert apply_recipe(parse("gemm(cublas)"), program).gemm == GemmConfig("cublas")
    for bad in ("gemm(mma,64,64)", "gemm(simt,64,64,16,4,2,8)", "gemm(tiled)", "gemm(cublas,1)"):
        with pytest.raises(ScheduleError):
            apply_recipe(parse(bad), program)


def test_cublas_path_is_a_library_launch_then_an_epilogue_kernel() -> None:
    program = lower(linear(64, 40, 48, transpose_b=True, batch=(3,)))
    kernel = generate(apply_recipe(parse("gemm(cublas)"), program), "cuda")
    gemm, epilogue = kernel.launches
    scalars = {a.name: a.value for a in gemm.args if not hasattr(a, "shape")}
    assert gemm.library == "cublas_gemm" and [a.name for a in gemm.args[:3]] == ["b1", "b0", "b4"]
    assert (scalars["m"], scalars["n"], scalars["k"], scalars["trans_b"], scalars["batch"]) == (48, 64, 40, 1, 3)
    assert (scalars["lda"], scalars["ldb"], scalars["stride_a"], scalars["stride_b"]) == (40, 40, 0, 64 * 40)
    assert epilogue.grid == (-(-3 * 64 * 48 // 256), 1, 1) and "k_gelu" in kernel.code
    plain = generate(apply_recipe(parse("gemm(cublas)"), lower(bmm(2, 8, 16, 24, "float32"))), "cuda")
    assert [launch.library for launch in plain.launches] == ["cublas_gemm"]  # nothing left for a kernel


CASES = [  # (graph, recipe, what the PTX must hold)
    (linear(64, 40, 48), "gemm(mma,128,128,32,4,3,8)", ("mma.sync.aligned.m16n8k16", "ldmatrix", "cp.async.cg")),
    (linear(70, 33, 50), "gemm(mma,64,64,32,4,2,1)", ("mma.sync",)),  # odd strides: plain loads
    (linear(72, 36, 52), "gemm(mma,64,128,64,8,4,8)", ("cp.async.ca",)),  # 8-byte copies
    (linear(40, 64, 24, "bfloat16", transpose_b=True, batch=(2, 3), residual=True), "gemm(mma,128,64,32,8,3,1)",
     ("bf16", "ldmatrix.sync.aligned.m8n8.x4.shared.b16")),
    (linear(33, 17, 29, "float32", act="relu"), "gemm(simt,64,64,16,4,1,8)", ("fma.rn.f32",)),
    (bmm(3, 20, 30, 40, "float64"), "gemm(simt,32,32,8,2,1,1)", ("fma.rn.f64",)),
    (linear(64, 40, 48, "bfloat16", act="silu"), "gemm(cublas)", (".entry tb_gemm",)),
    (linear(96, 64, 80), "gemm(mma,64,128,32,4,3,4)", ("mma.sync",)),  # raster groups of 4 tile rows
    (linear(33, 40, 29, "float32"), "gemm(simt,32,32,32,4,1,4)", ("fma.rn.f32",)),
    (linear(70, 24, 130, "float32", act="relu"), "gemm(simt,32,128,8,4,1,1)", ("fma.rn.f32",)),  # rectangular
    (bmm(2, 40, 36, 20, "float32"), "gemm(simt,32,32,8,1,1,8)", ("fma.rn.f32",)),  # one warp
]


@pytest.mark.skipif(not cuda.available(), reason="no NVRTC or nvcc")
def test_gemm_kernels_compile_to_ptx(tmp_path: Path) -> None:
    kernels = [generate(apply_recipe(parse(recipe), lower(graph)), "cuda") for graph, recipe, _ in CASES]
    results = build([Source(k.code, "cuda") for k in kernels], cache_dir=tmp_path)
    assert [(recipe, r.error[:400]) for (_, recipe, _), r in zip(CASES, results, strict=True) if not r.ok] == []
    for (_, recipe, needles), r in zip(CASES, results, strict=True):
        ptx = Path(r.artifact).read_text()
        assert all(n in ptx for n in needles), (recipe, [n for n in needles if n not in ptx])
    assert "trans" in Path(results[0].artifact).read_text()  # [K, N] weights go through ldmatrix.trans
    assert "trans" not in Path(results[3].artifact).read_text()  # [N, K] weights are already mma's layout



@needs_gpu
@pytest.mark.parametrize("case", range(len(CASES)))
def test_gemm_kernels_validate_on_the_gpu(tmp_path: Path, case: int) -> None:
    from tests.transforms.kernels import measure

    graph, recipe, _ = CASES[case]
    (result,) = measure(graph, [recipe], tmp_path, backend="cuda")
    assert result.ok, result.error
    assert 0 < result.median_s < 1e-3
