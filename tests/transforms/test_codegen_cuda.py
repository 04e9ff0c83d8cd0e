"""CUDA generation compiles to PTX for every zoo subgraph (default and random recipes); no GPU needed."""

import math
import random
import re
from pathlib import Path

import numpy as np
import pytest

from embed import zoo
from embed.builder import GraphBuilder
from embed.ir import Graph
from embed.lower import lower
from embed.partition import partition
from tests.gpu import needs_gpu
from tests.transforms.kernels import single
from transforms.build import Source, build
from transforms.codegen import generate
from transforms.codegen.cuda import ERF_A, ERF_P
from transforms.compilers import cuda
from transforms.recipe import parse
from transforms.space import RecipeSpace, default_recipe
from transforms.steps.inline import inline_gathers
from transforms.transformation import apply_recipe

pytestmark = pytest.mark.skipif(not cuda.available(), reason="no NVRTC or nvcc")
MODELS = ("bert_encoder-h64-s16-b1", "llama_block-h64-s16-b1", "resnet_bottleneck-c8-i8-b1", "gcn-n64-f16-d0.05",
          "lm_head-h32-v100-t16", "convnext_block-c8-i8-b1")


def test_zoo_subgraphs_compile_to_ptx(tmp_path: Path) -> None:
    rng = random.Random(0)
    kernels, labels = [], []
    for model in MODELS:
        for sub in partition(zoo.load(model)):
            program = lower(sub.graph)
            space = RecipeSpace(program, "cuda")
            for recipe in (default_recipe(program, "cuda"), space.sample(rng)):
                kernels.append(generate(apply_recipe(recipe, program), "cuda"))
                labels.append(f"{sub.ops} {recipe}")
    results = build([Source(k.code, "cuda") for k in kernels], cache_dir=tmp_path)
    assert [(label, r.error[:300]) for label, r in zip(labels, results, strict=True) if not r.ok] == []
    missing = [
        (label, launch.entry)
        for label, kernel, result in zip(labels, kernels, results, strict=True)
        for launch in kernel.launches
        if not launch.library and f".entry {launch.entry}(" not in Path(result.artifact).read_text()
    ]
    assert missing == []  # every generated launch's kernel is in the PTX (library launches, e.g. cuBLAS, are not)


def test_launch_shapes_follow_the_schedule() -> None:
    program = lower(single("softmax", [("x", (10, 300), "float16")], (10, 300), "float16", axis=-1))
    block = generate(apply_recipe(parse("fuse(all);threads(256);reduce(block);rows_per_block(2)"), program), "cuda")
    (launch,) = block.launches
    assert (launch.grid, launch.block) == ((5, 1, 1), (256, 1, 1))
    assert "__shfl_xor_sync" in block.code and "__syncthreads" in block.code and "k_h2f" in block.code
    warp = generate(apply_recipe(parse("fuse(all);threads(128);reduce(warp)"), program), "cuda")
    assert warp.launches[0].grid == (3, 1, 1) and "__syncwarp" in warp.code
    unfused = generate(apply_recipe(parse("fuse(none);reduce(thread)"), program), "cuda")
    assert len(unfused.launches) == 3 and "__shfl" not in unfused.code


def test_row_depth_strides_inner_columns_across_lanes() -> None:
    program = lower(single("softmax", [("x", (10, 300), "float16")], (10, 300), "float16", axis=-1))
    kernel = generate(apply_recipe(parse("fuse(none);threads(128);reduce(warp);row_depth(1)"), program), "cuda")
    assert [launch.grid for launch in kernel.launches] == [(3, 1, 1), (3, 1, 1), (3, 1, 1)]  # 10 rows, 4 per block
    exact = generate(apply_recipe(parse("fuse(all);threads(128);reduce(block);unroll(4)"), lower(
        single("softmax", [("x", (4, 512), "float16")], (4, 512), "float16", axis=-1))), "cuda")
    assert re.search(r"#pragma unroll 4\n\s*for \(int (t\d+) = 0; \1 < 4; \1\+\+\)", exact.code)  # constant trips


def _softmax(rows: int, cols: int):  # type: ignore[no-untyped-def]
    return lower(single("softmax", [("x", (rows, cols), "float16")], (rows, cols), "float16", axis=-1))


def _cross_entropy(rows: int, classes: int) -> Graph:
    b = GraphBuilder("ce")
    logits, target = b.input("logits", (rows, classes), "float32"), b.input("target", (rows,), "int64")
    logp = b.node("log_softmax", [logits], (rows, classes), "float32", axis=1)
    return b.build([b.node("nll_loss", [logp, target], (), "float32", name="out", reduction="mean")])


def _add_layernorm(rows: int, cols: int) -> Graph:
    b = GraphBuilder("add_ln")
    x, r = b.input("x", (rows, cols), "float16"), b.input("r", (rows, cols), "float16")
    w, bias = b.input("w", (cols,), "float16"), b.input("b", (cols,), "float16")
    s = b.node("add", [x, r], (rows, cols), "float16")
    return b.build([b.node("layer_norm", [s, w, bias], (rows, cols), "float16", name="out", axes=[1], eps=1e-5)])


def test_registers_mode_reads_each_input_once_with_16_byte_words() -> None:
    code = generate(apply_recipe(parse("fuse(all);threads(256);reduce(block);row_mode(registers);vectorize(8)"),
                    _softmax(64, 128)), "cuda")
    (launch,) = code.launches
    assert (launch.grid, launch.block) == ((2, 1, 1), (256, 1, 1))  # 8 lanes of 2 x 8 halves per row: 32 rows a block
    assert code.code.count("*(const uint4*)((const char*)(b0") == 2 and code.code.count("*(uint4*)") == 2  # per chunk
    assert "b2[" not in code.code and "b3[" not in code.code  # max and sum never leave registers
    assert code.code.count("__shfl_xor_sync(0xffffffffu, acc") == 6  # 3 sub-warp levels for each reduction
    ln = lower(_add_layernorm(8, 768))
    text = generate(apply_recipe(parse("fuse(all);threads(256);reduce(block);row_mode(registers);vectorize(8)"), ln),
                    "cuda").code
    assert text.count("(const uint4*)((const char*)(b0") == 3 and text.count("(const uint4*)((const char*)(b1") == 3
    assert "b5[" not in text  # the residual sum stays in registers, never stored


def test_misaligned_rows_fall_back_to_narrower_words() -> None:
    recipe = parse("fuse(all);threads(64);reduce(warp);row_mode(stream);vectorize(8)")
    code = generate(apply_recipe(recipe, _softmax(4, 300)), "cuda").code  # 300 = 4 * 75: 8-byte words
    assert "uint2" in code and "uint4" not in code
    odd = generate(apply_recipe(recipe, _softmax(4, 301)), "cuda").code  # odd rows: scalar accesses only
    assert "uint" not in odd.split("tb_kernel0")[1]


def test_online_mode_merges_max_and_sum_into_one_pass() -> None:
    recipe = "fuse(all);threads(1024);reduce(block);row_mode({});vectorize(8)"
    online = generate(apply_recipe(parse(recipe.format("online")), _softmax(4, 32000)), "cuda").code
    stream = generate(apply_recipe(parse(recipe.format("stream")), _softmax(4, 32000)), "cuda").code
    fits = generate(apply_recipe(parse(recipe.format("registers")), _softmax(4, 32000)), "cuda").code
    body = online.split("tb_kernel0")[1]
    assert body.count("(const uint4*)((const char*)(b0") == 2 and "k_online(" in body  # 2 passes, not 3
    assert stream.split("tb_kernel0")[1].count("(const uint4*)((const char*)(b0") == 3
    assert fits.split("tb_kernel0")[1].count("(const uint4*)((const char*)(b0") == 4  # 4 unrolled chunks, once


def _layernorm(rows: int, cols: int, dtype: str = "float16"):  # type: ignore[no-untyped-def]
    b = GraphBuilder("ln")
    x, w, bias = b.input("x", (rows, cols), dtype), b.input("w", (cols,), dtype), b.input("b", (cols,), dtype)
    return lower(b.build([b.node("layer_norm", [x, w, bias], (rows, cols), dtype, name="out", axes=[1], eps=1e-5)]))


def test_registers_mode_reuses_per_element_values_and_multiplies_by_reciprocals() -> None:
    text = generate(apply_recipe(parse("fuse(all);threads(256);reduce(block);row_mode(registers);vectorize(8)"),
                    _softmax(64, 128)), "cuda").code
    assert text.count("k_fexp((v") == 16  # exp(x - max) once per element: the sum's values feed the output
    assert re.search(r"const float q\d+ = \(\(float\)1 / r\d+\);", text)  # 1 / sum, once per row
    assert " / r" not in text.split("(float)1 / r")[1]  # every output multiplies by it


def test_rows_per_block_sets_the_lanes_of_register_rows() -> None:
    program = _layernorm(64, 768)
    fit = generate(apply_recipe(parse("fuse(all);threads(256);reduce(block);row_mode(registers)"), program), "cuda")
    four = generate(apply_recipe(parse("fuse(all);threads(256);reduce(block);rows_per_block(4);row_mode(registers)"),
                                 program), "cuda")
    assert "tid / 32;" in fit.code and fit.launches[0].grid == (8, 1, 1)  # 32 lanes hold 768: 8 rows a block
    assert "tid / 64;" in four.code and four.launches[0].grid == (16, 1, 1)  # 64 lanes: 4 rows a block


def test_online_mode_runs_mean_and_variance_as_one_welford_pass() -> None:
    recipe = "fuse(all);threads(256);reduce(block);row_mode({});vectorize(8)"
    online = generate(apply_recipe(parse(recipe.format("online")), _layernorm(4, 8192)), "cuda").code
    stream = generate(apply_recipe(parse(recipe.format("stream")), _layernorm(4, 8192)), "cuda").code
    assert online.split("tb_kernel0")[1].count("(const uint4*)((const char*)(b0") == 2 and "k_welford(" in online
    assert stream.split("tb_kernel0")[1].count("(const uint4*)((const char*)(b0") == 3


def test_shared_mode_reads_the_row_once_and_falls_back_past_the_limit() -> None:
    recipe = "fuse(all);threads({});reduce(block);rows_per_block({});row_mode(shared);vectorize(8)"
    kernel = generate(apply_recipe(parse(recipe.format(512, 1)), _softmax(4, 32000)), "cuda")
    body = kernel.code.split("tb_kernel0")[1]
    assert body.count("(const uint4*)((const char*)(b0") == 1 and body.count("(k_smem + 0 +") == 2
    assert kernel.launches[0].shared_bytes == 8 * 512 * 8 * 2  # 8 chunks of 512 lanes x 8 halves
    ln = generate(apply_recipe(parse(recipe.format(256, 1)), _layernorm(4, 8192)), "cuda")
    assert ln.launches[0].shared_bytes == 8192 * 2 and "k_welford(" in ln.code  # x only: w and b stay global
    wide = generate(apply_recipe(parse(recipe.format(1024, 2)), lower(_cross_entropy(4, 65536))), "cuda")
    assert all(launch.shared_bytes == 0 for launch in wide.launches) and "k_smem" not in wide.code  # one pass
    big = generate(apply_recipe(parse(recipe.format(1024, 2)), _softmax(4, 65536)), "cuda")
    assert big.launches[0].shared_bytes == 0 and "k_online(" in big.code  # 2 x 128 KB: online instead


def test_block_rows_fold_warps_with_shuffles_and_registers_fall_back_to_shared() -> None:
    wide = generate(apply_recipe(parse("fuse(all);threads(512);reduce(block);row_mode(registers);vectorize(8)"),
                                 _softmax(4, 32000)), "cuda")
    assert wide.launches[0].shared_bytes > 0 and "k_smem" in wide.code  # too long for registers: shared rows
    assert "for (int w" not in wide.code and "+ tid % 16];" in wide.code  # 16 warps: 4 more shuffle levels


def test_exp_is_approximate_only_for_half_outputs() -> None:
    half = generate(apply_recipe(parse("fuse(all);row_mode(online)"), _softmax(4, 1000)), "cuda").code
    single = generate(apply_recipe(parse("fuse(all);row_mode(online)"), lower(_cross_entropy(4, 1000))), "cuda").code
    assert "ex2.approx" in half and "expf(" not in half.split("k_online")[1].split("tb_kernel0")[0]
    assert "k_fexp" not in single and "expf(" in single


def _bias_gelu(rows: int, cols: int, dtype: str) -> Graph:
    b = GraphBuilder("bias_gelu")
    x, bias = b.input("x", (rows, cols), dtype), b.input("bias", (cols,), dtype)
    s = b.node("add", [x, bias], (rows, cols), dtype)
    return b.build([b.node("gelu", [s], (rows, cols), dtype, name="out", approximate="none")])


def test_gelu_is_fast_only_for_half_outputs() -> None:
    half, single = (generate(apply_recipe(parse("fuse(all);row_mode(registers)"), lower(_bias_gelu(4, 512, d))),
                             "cuda").code.split('extern "C"')[1] for d in ("float16", "float32"))
    assert "k_fgelu(" in half and "k_gelu(" not in half
    assert "k_gelu(" in single and "k_fgelu(" not in single


def test_fast_gelu_stays_within_one_fp16_ulp() -> None:
    """The constants of ``k_fgelu`` evaluated as the kernel does (float32), against GELU in float64."""
    f = np.float32
    x = np.linspace(-12, 12, 240_001, dtype=f)
    exact = 0.5 * x.astype(np.float64) * np.vectorize(math.erfc)(-x.astype(np.float64) / math.sqrt(2))
    a = np.abs(x) * f(math.sqrt(0.5))
    t = f(1) / (f(ERF_P) * a + f(1))
    poly = f(ERF_A[-1])
    for coefficient in reversed(ERF_A[:-1]):
        poly = poly * t + f(coefficient)
    erfc = poly * t * np.exp(-a * a)
    fast = f(0.5) * x * np.where(x < 0, erfc, f(2) - erfc)
    ulp = np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64)
    assert np.max(np.abs(fast - exact) / ulp) < 1.0


def test_single_row_groups_take_a_full_block() -> None:
    kernel = generate(apply_recipe(parse("fuse(all);threads(128);reduce(block);unroll(4)"),
                                   lower(_cross_entropy(64, 1000))), "cuda")
    assert [launch.block for launch in kernel.launches] == [(128, 1, 1), (1024, 1, 1)]  # the mean over rows


def test_inline_gather_drops_the_log_probabilities() -> None:
    program = lower(_cross_entropy(16, 1000))
    inlined = inline_gathers(program)
    assert len(inlined.nests) == len(program.nests) - 1
    assert [n.op for n in inlined.nests] == ["log_softmax", "log_softmax", "nll_loss"]
    t1 = program.nests[2].statement.write.tensor
    assert all(a.tensor != t1 for n in inlined.nests for a in n.loads())
    assert "inline" not in str(default_recipe(lower(_add_layernorm(16, 768)), "cuda"))  # dense readers: not offered


@pytest.mark.parametrize("make", [lambda: _softmax(7, 300), lambda: lower(_cross_entropy(5, 999)),
                                  lambda: lower(_add_layernorm(3, 200))])
def test_row_kernels_compile_for_every_mode(tmp_path: Path, make) -> None:  # type: ignore[no-untyped-def]
    program = make()
    recipes = [f"fuse(all);threads({t});reduce({r});rows_per_block(2);row_mode({m});vectorize({v});unroll(2)"
               for m in ("registers", "online", "stream", "shared") for v in (1, 8) for t, r in
               ((64, "lanes,4"), (128, "warp"), (1024, "block"), (32, "thread"))]
    sources = [Source(generate(apply_recipe(parse(r), program), "cuda").code, "cuda") for r in recipes]
    results = build(sources, cache_dir=tmp_path)
    assert [(r, b.error[:300]) for r, b in zip(recipes, results, strict=True) if not b.ok] == []



@needs_gpu
@pytest.mark.parametrize("recipe", ["", "fuse(none);reduce(thread)", "fuse(all);reduce(warp);rows_per_block(4)",
                                    "fuse(all);threads(512);reduce(block);rows_per_block(2);unroll(4)",
                                    "fuse(none);reduce(warp);row_depth(1)"])
def test_generated_cuda_validates_on_the_gpu(tmp_path: Path, recipe: str) -> None:
    from tests.transforms.kernels import measure

    graph = single("softmax", [("x", (300, 1000), "float16")], (300, 1000), "float16", axis=-1)
    (result,) = measure(graph, [recipe], tmp_path, backend="cuda")
    assert result.ok, result.error
    assert result.max_rel_err < 1e-2 and 0 < result.median_s < 1e-3


ROW_RECIPES = [
    "fuse(all);threads(256);reduce(block);row_mode(registers);vectorize(8)",
    "fuse(all);threads(256);reduce(block);rows_per_block(4);row_mode(registers);vectorize(4)",
    "fuse(all);threads(512);reduce(block);row_mode(shared);vectorize(8);unroll(2)",
    "fuse(all);threads(128);reduce(warp);rows_per_block(2);row_mode(shared);vectorize(4)",
    "fuse(all);threads(128);reduce(lanes,8);row_mode(registers);vectorize(4)",
    "fuse(all);threads(1024);reduce(block);row_mode(online);vectorize(8);inline(gather)",
    "fuse(all);threads(64);reduce(warp);rows_per_block(2);row_mode(stream);vectorize(2);unroll(2)",
    "fuse(all);threads(32);reduce(thread);row_mode(registers);vectorize(1)",
]


@needs_gpu
@pytest.mark.parametrize("recipe", ["", "fuse(all);threads(256);reduce(block);row_mode(online);vectorize(8)",
                                    "fuse(all);threads(512);reduce(block);row_mode(shared);vectorize(4);unroll(2)"])
def test_wide_rows_validate_on_the_gpu(tmp_path: Path, recipe: str) -> None:
    from tests.transforms.kernels import measure

    b = GraphBuilder("ln")
    x, w, bias = b.input("x", (32, 8192), "float16"), b.input("w", (8192,), "float16"), b.input("b", (8192,), "float16")
    ln = b.build([b.node("layer_norm", [x, w, bias], (32, 8192), "float16", name="out", axes=[1], eps=1e-5)])
    graphs = [single("softmax", [("x", (48, 32000), "float16")], (48, 32000), "float16", axis=-1), ln,
              _cross_entropy(16, 32000)]  # rows past registers: shared or online, Welford for the layernorm
    results = [measure(g, [recipe], tmp_path, backend="cuda")[0] for g in graphs]
    assert [(x.error_kind, x.error[:200]) for x in results if not x.ok] == []


@needs_gpu
def test_fast_gelu_validates_on_the_gpu(tmp_path: Path) -> None:
    from tests.transforms.kernels import measure

    (result,) = measure(_bias_gelu(512, 3072, "float16"), ["fuse(all);row_mode(registers);vectorize(8)"], tmp_path,
                        backend="cuda")
    assert result.ok, result.error
    assert result.max_rel_err < 1e-3  # fp16 rounding (4.9e-4), not the approximation


@needs_gpu
@pytest.mark.parametrize("graph", ["softmax", "cross_entropy", "add_layernorm"])
def test_row_kernels_validate_on_the_gpu(tmp_path: Path, graph: str) -> None:
    from tests.transforms.kernels import measure

    g = {"softmax": single("softmax", [("x", (300, 1000), "float16")], (300, 1000), "float16", axis=-1),
         "cross_entropy": _cross_entropy(64, 4000), "add_layernorm": _add_layernorm(100, 776)}[graph]
    results = measure(g, [r.replace(";inline(gather)", "") if graph != "cross_entropy" else r for r in ROW_RECIPES],
                      tmp_path, backend="cuda")
    assert [(r, x.error[:200]) for r, x in zip(ROW_RECIPES, results, strict=True) if not x.ok] == []


def _add_layernorm_silu(rows: int, cols: int) -> Graph:
    b = GraphBuilder("add_ln_silu")
    x, bias = b.input("x", (rows, cols), "float32"), b.param("bias", (cols,), "float32")
    w, beta = b.param("w", (cols,), "float32"), b.param("beta", (cols,), "float32")
    s = b.node("add", [x, bias], (rows, cols), "float32")
    n = b.node("layer_norm", [s, w, beta], (rows, cols), "float32", axes=[1], eps=1e-5)
    return b.build([b.node("silu", [n], (rows, cols), "float32", name="out")])


WIDE = parse("fuse(all);threads(64);reduce(warp);row_mode(registers);vectorize(8)")


def test_a_lane_owns_one_16_byte_word_a_chunk_so_a_warps_words_are_contiguous() -> None:
    fp32 = generate(apply_recipe(WIDE, lower(_add_layernorm_silu(8, 1024))), "cuda").code
    # 8 floats a lane would be two words 32 bytes apart per lane: 4 floats a lane, 8 chunks of 32 lanes x 4
    assert "const idx_t kc7 = 896 + (idx_t)lane * 4;" in fp32 and "kc8" not in fp32
    assert " + 16)" not in fp32 and "(const uint4*)((const char*)(b0" in fp32  # one 16-byte word, no second
    half = generate(apply_recipe(WIDE, lower(_add_layernorm(8, 1024))), "cuda").code
    assert "const idx_t kc3 = 768 + (idx_t)lane * 8;" in half  # 8 halves are one word
    b = GraphBuilder("mixed")  # half rows, float32 weights: the rows' words decide, the weights stay in L1
    x, w, beta = b.input("x", (8, 1024), "float16"), b.param("w", (1024,), "float32"), b.param("b", (1024,), "float32")
    mixed = b.build([b.node("layer_norm", [x, w, beta], (8, 1024), "float16", name="out", axes=[1], eps=1e-5)])
    assert "const idx_t kc3 = 768 + (idx_t)lane * 8;" in generate(apply_recipe(WIDE, lower(mixed)), "cuda").code


def test_one_word_lanes_compute_the_reference_on_host_threads(tmp_path: Path) -> None:
    from tests.transforms.test_views import threaded_host_source
    from transforms.problem import make_problem
    from transforms.run import Trial, Worker, run

    graph = _add_layernorm_silu(4, 256)  # 2 chunks of 32 lanes x 4 floats a row, 2 rows a block
    program = lower(graph)
    kernel = generate(apply_recipe(WIDE, program), "cuda")
    assert "const idx_t kc1 = 128 + (idx_t)lane * 4;" in kernel.code
    options = ("-x", "c++", "-pthread", "-w", "-O1")
    (built,) = build([Source(threaded_host_source(kernel.code, kernel.launches), "cpu", options=options)],
                     cache_dir=tmp_path)
    assert built.ok, built.error[:2000]
    with Worker() as worker:
        (result,) = run([Trial(built, kernel.launches, make_problem(graph, program, seed=5))], worker=worker,
                        repeats=1, warmup=0)
    assert result.ok, result.error
