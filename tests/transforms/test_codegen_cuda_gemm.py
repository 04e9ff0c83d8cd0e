"""The gemm step: contraction matching, legal configurations, PTX for several tiles and odd shapes, and
(gpu-marked) validation of every path against the float64 reference."""

from dataclasses import replace
from pathlib import Path

import pytest

from embed.builder import GraphBuilder
from embed.ir import DType, Graph
from embed.lower import lower
from tests.gpu import needs_gpu
from tests.transforms.kernels import single
from transforms.build import Source, build
from transforms.codegen import generate
from transforms.compilers import cuda
from transforms.contraction import (
    LT_ALGOS,
    SPLIT_K,
    GemmConfig,
    VendorPlan,
    gemm_configs,
    match_contraction,
    vendor_plan,
)
from transforms.recipe import format as format_recipe
from transforms.recipe import parse
from transforms.run import Scalar
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


def two_outputs(m: int, k: int, n: int, dtype: str = "float16") -> Graph:
    """y = x @ w and out = relu(y), both outputs."""
    b = GraphBuilder("two")
    y = b.node("matmul", [b.input("x", (m, k), dtype), b.param("w", (k, n), dtype)], (m, n), dtype, name="y")
    return b.build([y, b.node("relu", [y], (m, n), dtype, name="out")])


def tanh_mlp(m: int, k: int, n: int, dtype: str = "float16", *, gate: bool = False) -> Graph:
    """gelu_tanh(x @ w + bias), times the pre-activation with ``gate`` (which cuBLASLt then cannot fold)."""
    b = GraphBuilder("mlp")
    y = b.node("matmul", [b.input("x", (m, k), dtype), b.param("w", (k, n), dtype)], (m, n), dtype)
    y = b.node("add", [y, b.param("bias", (n,), dtype)], (m, n), dtype)
    if not gate:
        return b.build([b.node("gelu", [y], (m, n), dtype, name="out", approximate="tanh")])
    g = b.node("gelu", [y], (m, n), dtype, approximate="tanh")
    return b.build([b.node("mul", [g, y], (m, n), dtype, name="out")])


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
    double = match_contraction(lower(bmm(2, 8, 16, 24, "float64")))
    assert half is not None and single_precision is not None and double is not None
    configs = gemm_configs(half)
    lt = [GemmConfig("cublaslt", algo=r) for r in range(LT_ALGOS)]
    assert configs[:2] == [lt[0], GemmConfig("mma", 128, 128, 32, 4, 3, 8)] and configs[-1] == GemmConfig("cublas")
    assert configs[-1 - LT_ALGOS + 1:-1] == lt[1:] and len(set(configs)) == len(configs)
    assert all(g.legal(half) for g in configs) and {g.path for g in configs} == {"mma", "cublaslt", "cublas"}
    assert {g.path for g in gemm_configs(single_precision)} == {"simt", "cublaslt", "cublas"}
    assert gemm_configs(single_precision)[0] == lt[0]
    assert gemm_configs(double)[0] == GemmConfig("simt", 64, 64, 16, 4, 1, 8)  # cuBLASLt's fp64 is a choice only
    assert not GemmConfig("cublaslt", algo=LT_ALGOS).legal(half)
    assert not GemmConfig("mma", 128, 128, 32, 4, 3, 8).legal(single_precision)  # no fp32 tensor-core path
    assert not GemmConfig("mma", 256, 256, 64, 4, 4, 1).legal(half)  # too much shared memory
    assert not GemmConfig("mma", 48, 64, 32, 4, 3, 1).legal(half)  # warps do not tile the block
    assert GemmConfig("mma", 128, 128, 32, 4, 3, 8).shared_bytes(half) == 2 * 3 * (128 * 40 + 32 * 136)


def test_split_k_parts_hold_at_least_two_k_tiles_and_none_is_empty() -> None:
    c = match_contraction(lower(linear(33, 130, 29, "float32")))  # 17 k tiles of 8
    assert c is not None
    simt = GemmConfig("simt", 32, 32, 8, 4, 1, 1)
    legal = [s for s in SPLIT_K if replace(simt, split=s).legal(c)]
    assert legal == [1, 2, 3, 4, 6]  # 8: parts of 3 tiles make 6, not 8; 12, 16: parts of 2 make 9
    assert (replace(simt, split=3).k_part(c), replace(simt, split=3).args) == (6, ("simt", 32, 32, 8, 4, 1, 1, 3))
    assert not replace(simt, split=5).legal(c)  # not an offered split
    assert not GemmConfig("cublaslt", split=2).legal(c)  # the libraries split k themselves
    configs = gemm_configs(c)
    assert {g.split for g in configs} == set(legal) and len(configs) == len(set(configs))
    many = match_contraction(lower(bmm(5000, 8, 256, 8, "float32")))  # 32 k tiles; grid z holds 65535 blocks
    assert many is not None
    assert replace(simt, split=8).legal(many) and not replace(simt, split=16).legal(many)  # 80,000 > 65,535


def test_the_step_is_in_the_cuda_space_and_checks_its_arguments() -> None:
    program = lower(linear(64, 40, 48))
    assert str(default_recipe(program, "cuda")) == "gemm(cublaslt,0)"
    assert apply_recipe(parse("gemm(mma,64,128,64,8,4,1)"), program).gemm == GemmConfig("mma", 64, 128, 64, 8, 4, 1)
    assert apply_recipe(parse("gemm(cublas)"), program).gemm == GemmConfig("cublas")
    assert apply_recipe(parse("gemm(cublaslt,3)"), program).gemm == GemmConfig("cublaslt", algo=3)
    long_k = lower(linear(64, 256, 48))
    assert apply_recipe(parse("gemm(mma,64,64,32,4,3,1,4)"), long_k).gemm == GemmConfig("mma", 64, 64, 32, 4, 3, 1,
                                                                                         split=4)
    (space,) = RecipeSpace(program, "cuda").dims
    for text in ("gemm(cublaslt,3)", "gemm(cublas)", "gemm(mma,64,128,64,8,4,1)"):  # stored strings round-trip
        assert format_recipe(parse(text)) == text and set(parse(text)) <= set(space)
    for bad in ("gemm(mma,64,64)", "gemm(simt,64,64,16,4,2,8)", "gemm(tiled)", "gemm(cublas,1)", "gemm(cublaslt)",
                f"gemm(cublaslt,{LT_ALGOS})", "gemm(cublaslt,1,2)", "gemm(mma,64,64,32,4,3,1,1)",
                "gemm(mma,64,64,32,4,3,1,2)"):  # split 1 is written without it; 40 k has no two parts of 2 tiles
        with pytest.raises(ScheduleError):
            apply_recipe(parse(bad), program)
    stacked = lower(linear(64, 40, 48, "float32", transpose_b=True, batch=(3,)))
    (space,) = RecipeSpace(stacked, "cuda").dims
    assert apply_recipe(parse("gemm(cublaslt,3,batched)"), stacked).gemm == GemmConfig("cublaslt", algo=3, batched=True)
    assert apply_recipe(parse("gemm(cublas,batched)"), stacked).gemm == GemmConfig("cublas", batched=True)
    for text in ("gemm(cublaslt,3,batched)", "gemm(cublas,batched)"):
        assert format_recipe(parse(text)) == text and set(parse(text)) <= set(space)
    # each vendor configuration, then its batched twin: the fill measures both shapes of the heuristic's first choice
    assert [str(r) for r in RecipeSpace(stacked, "cuda").vendor_ranked()[:4]] == [
        "gemm(cublaslt,0)", "gemm(cublaslt,0,batched)", "gemm(cublaslt,1)", "gemm(cublaslt,1,batched)"]
    for bad, target in (("gemm(cublaslt,0,batched)", program), ("gemm(cublas,batched)", lower(bmm(2, 8, 16, 24,
                        "float32"))), ("gemm(cublaslt,0,batch)", stacked), ("gemm(cublas,batched,batched)", stacked)):
        with pytest.raises(ScheduleError):  # no batches to stack (one matrix, or a B per batch), or a bad argument
            apply_recipe(parse(bad), target)


def test_cublas_path_is_a_library_launch_then_an_epilogue_kernel() -> None:
    program = lower(linear(64, 40, 48, transpose_b=True, batch=(3,)))
    kernel = generate(apply_recipe(parse("gemm(cublas)"), program), "cuda")
    gemm, epilogue = kernel.launches
    scalars = {a.name: a.value for a in gemm.args if not hasattr(a, "shape")}
    assert gemm.library == "cublas_gemm" and [a.name for a in gemm.args[:3]] == ["b1", "b0", "b4"]
    # the weight is every batch's: the 3 batches of 64 rows run as one product of 192 rows
    assert (scalars["m"], scalars["n"], scalars["k"], scalars["trans_a"], scalars["batch"]) == (48, 3 * 64, 40, 1, 1)
    assert (scalars["lda"], scalars["ldb"], scalars["stride_a"], scalars["stride_b"]) == (40, 40, 0, 64 * 40)
    assert scalars["type_c"] == 0 and "k_gelu" in kernel.code  # the product in fp32 scratch: the bias add follows
    assert epilogue.grid == (-(-3 * 64 * 48 // (8 * 256)), 1, 1)  # 8 elements a thread: 2 x 16 bytes in, 16 out
    assert "k_ld4(d + 4, (const char*)(b4 + e) + 16);" in kernel.code and "k_st4((char*)(b3 + e), w_b3);" in kernel.code
    assert [a.name for a in epilogue.args] == ["b0", "b1", "b2", "b3", "b4"]  # b5 stays in registers
    plain = generate(apply_recipe(parse("gemm(cublas)"), lower(bmm(2, 8, 16, 24, "float32"))), "cuda")
    assert [launch.library for launch in plain.launches] == ["cublas_gemm"]  # nothing left for a kernel
    scalars = {a.name: a.value for a in plain.launches[0].args if not hasattr(a, "shape")}
    assert (scalars["n"], scalars["batch"], scalars["stride_a"]) == (8, 2, 16 * 24)  # each batch its own B
    batched = generate(apply_recipe(parse("gemm(cublas,batched)"), program), "cuda").launches[0]
    scalars = {a.name: a.value for a in batched.args if not hasattr(a, "shape")}
    assert (scalars["n"], scalars["batch"], scalars["stride_b"], scalars["stride_c"]) == (64, 3, 64 * 40, 64 * 48)


def test_batches_stack_into_one_matrix_only_when_b_is_shared_and_a_runs_on() -> None:
    c = match_contraction(lower(linear(8, 16, 24, "float32", transpose_b=True, batch=(2, 3))))
    assert c is not None and c.a.batch == (3 * 8 * 16, 8 * 16) and c.a.outer == 16 and c.stacked_rows
    assert not replace(c, b=replace(c.b, batch=(0, 24 * 16))).stacked_rows  # a B per batch
    assert not replace(c, a=replace(c.a, batch=(3 * 8 * 16, 8 * 16 + 16))).stacked_rows  # a gap after each batch
    assert not replace(c, a=replace(c.a, batch=(3 * 8 * 16 + 1, 8 * 16))).stacked_rows  # ... after each outer one
    assert not replace(c, batch=()).stacked_rows


def test_cublaslt_takes_the_bias_and_an_exact_activation() -> None:
    def plan(graph: Graph, fold: bool = True) -> VendorPlan | None:
        c = match_contraction(lower(graph))
        assert c is not None
        return vendor_plan(c, fold=fold)

    f16, f32 = DType.FLOAT16, DType.FLOAT32
    assert plan(linear(64, 40, 48)) == VendorPlan(1, "bias", None, "out", f16)  # erf gelu is left to the kernel
    assert plan(linear(64, 40, 48), fold=False) == VendorPlan(0, None, None, "t1", f32)  # the bias add follows
    assert plan(linear(64, 40, 48, residual=True)) == VendorPlan(0, None, None, "t1", f32)  # so does the residual
    assert plan(linear(33, 17, 29, "float32", act="relu")) == VendorPlan(2, "bias", "relu", "out", f32)
    assert plan(tanh_mlp(64, 32, 48)) == VendorPlan(2, "bias", "gelu_tanh", "out", f16)
    assert plan(tanh_mlp(64, 32, 48, gate=True)) == VendorPlan(1, "bias", None, "out", f16)  # y is read twice
    assert plan(tanh_mlp(64, 32, 48)).epilogue == 36 and plan(linear(64, 40, 48)).epilogue == 4  # type: ignore[union-attr]
    mixed = GraphBuilder("mixed")
    y = mixed.node("matmul", [mixed.input("x", (8, 16), "float16"), mixed.param("w", (16, 24), "float32")], (8, 24),
                   "float32", name="out")
    assert plan(mixed.build([y])) is None and plan(mixed.build([y]), fold=False) is None
    program = lower(tanh_mlp(64, 32, 48))
    lt = generate(apply_recipe(parse("gemm(cublaslt,2)"), program), "cuda")
    (launch,) = lt.launches  # bias and tanh-gelu in cuBLASLt's epilogue: no kernel
    scalars = {a.name: a.value for a in launch.args if not hasattr(a, "shape")}
    assert launch.library == "cublaslt_matmul" and [a.name for a in launch.buffers] == ["b1", "b0", "b3", "b2"]
    assert (scalars["epilogue"], scalars["bias"], scalars["algo"], scalars["type_c"]) == (36, 1, 2, 2)
    both = generate(apply_recipe(parse("gemm(cublaslt,0)"), lower(two_outputs(64, 32, 48))), "cuda")
    assert "k_st4((char*)(b3 + e), w_b3);" in both.code and "(char*)(b2" not in both.code  # y is done: only read
    odd = generate(apply_recipe(parse("gemm(cublaslt,0)"), lower(linear(33, 17, 29, "float32", act="relu"))), "cuda")
    assert "k_ld" not in odd.code and odd.launches[1].grid == (-(-33 * 29 // 256), 1, 1)  # rows of 29: one a thread


CASES = [  # (graph, recipe, what the PTX must hold)
    (linear(64, 40, 48), "gemm(mma,128,128,32,4,3,8)", ("mma.sync.aligned.m16n8k16", "ldmatrix", "cp.async.cg")),
    (linear(70, 33, 50), "gemm(mma,64,64,32,4,2,1)", ("mma.sync",)),  # odd strides: plain loads
    (linear(72, 36, 52), "gemm(mma,64,128,64,8,4,8)", ("cp.async.ca",)),  # 8-byte copies
    (linear(40, 64, 24, "bfloat16", transpose_b=True, batch=(2, 3), residual=True), "gemm(mma,128,64,32,8,3,1)",
     ("bf16", "ldmatrix.sync.aligned.m8n8.x4.shared.b16")),
    (linear(33, 17, 29, "float32", act="relu"), "gemm(simt,64,64,16,4,1,8)", ("fma.rn.f32",)),
    (bmm(3, 20, 30, 40, "float64"), "gemm(simt,32,32,8,2,1,1)", ("fma.rn.f64",)),
    (linear(64, 40, 48, "bfloat16", act="silu"), "gemm(cublas)", (".entry tb_gemm",)),
    (linear(64, 40, 48), "gemm(cublaslt,0)", ("ld.global.v4.u32", "st.global.v4.u32")),
    (linear(70, 33, 50), "gemm(cublaslt,1)", ("ld.global.u32", "st.global.u32")),  # rows of 50: 2 halves a thread
    (linear(33, 17, 29, "float32", act="relu"), "gemm(cublaslt,0)", (".entry tb_gemm",)),
    (linear(40, 64, 24, "bfloat16", transpose_b=True, batch=(2, 3), residual=True), "gemm(cublaslt,0)",
     ("ld.global.v4.u32",)),
    (tanh_mlp(64, 32, 48), "gemm(cublaslt,0)", ()),
    (two_outputs(64, 32, 48), "gemm(cublaslt,0)", ("st.global.v4.u32",)),
    (bmm(3, 20, 30, 40, "float64"), "gemm(cublaslt,0)", ()),
    (linear(96, 64, 80), "gemm(mma,64,128,32,4,3,4)", ("mma.sync",)),  # raster groups of 4 tile rows
    (linear(33, 40, 29, "float32"), "gemm(simt,32,32,32,4,1,4)", ("fma.rn.f32",)),
    (linear(70, 24, 130, "float32", act="relu"), "gemm(simt,32,128,8,4,1,1)", ("fma.rn.f32",)),  # rectangular
    (bmm(2, 40, 36, 20, "float32"), "gemm(simt,32,32,8,1,1,8)", ("fma.rn.f32",)),  # one warp
    # split-K: parts of k, then the sum of the parts and the epilogue (vector loads where the rows allow)
    (linear(64, 256, 48), "gemm(mma,64,64,32,4,3,1,4)", (".entry tb_gemm_sum", "ld.global.v4.u32")),
    (linear(70, 132, 50), "gemm(mma,64,64,32,4,2,8,2)", (".entry tb_gemm_sum", "ld.global.v2.u32")),  # rows of 50
    (linear(40, 256, 24, "bfloat16", transpose_b=True, batch=(2, 3), residual=True), "gemm(mma,64,64,32,4,2,4,3)",
     ("bf16",)),  # 8 k tiles in parts of 3, 3 and 2
    (two_outputs(64, 256, 48), "gemm(mma,64,64,64,4,2,1,2)", ("st.global.v4.u32",)),
    (linear(33, 130, 29, "float32", act="relu"), "gemm(simt,32,32,8,4,1,1,3)", ("fma.rn.f32",)),  # 17 k tiles
    (bmm(3, 20, 100, 40, "float64"), "gemm(simt,32,32,8,2,1,1,2)", ("fma.rn.f64",)),
    # stacked batches: one library product of 2 x 3 x 40 rows, the bias (and relu) in cuBLASLt's epilogue
    (linear(40, 64, 24, "float32", transpose_b=True, batch=(2, 3), residual=True), "gemm(cublas)", (".entry tb_gemm",)),
    (linear(40, 64, 24, "float32", batch=(2, 3), act="relu"), "gemm(cublaslt,0)", (".entry tb_gemm",)),
    (linear(40, 64, 24, "float32", batch=(2, 3), act="relu"), "gemm(cublaslt,1,batched)", (".entry tb_gemm",)),
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


@needs_gpu
def test_a_cublaslt_binding_frees_its_descriptors_with_the_call() -> None:
    import gc

    from transforms.vendor_blas import cublaslt_matmul

    (launch,) = generate(apply_recipe(parse("gemm(cublaslt,0)"), lower(tanh_mlp(64, 32, 48))), "cuda").launches
    call = cublaslt_matmul(launch)
    destroyed = call.destroyed
    assert destroyed.alive
    del call
    gc.collect()
    assert not destroyed.alive
    args = tuple(replace(a, value=999) if isinstance(a, Scalar) and a.name == "algo" else a for a in launch.args)
    with pytest.raises(RuntimeError, match="none of rank 999"):  # the descriptors are freed on the way out too
        cublaslt_matmul(replace(launch, args=args))
