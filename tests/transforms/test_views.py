"""Views of a contraction's output (head splits, flattening, transposes) folded into its epilogue's store: the
program stays a GEMM (the gemm step's space, cuBLASLt writing the view itself), the folded program computes what the
lowered one does, and the generated kernels store each element where the view puts it: on the cpu backend, and
the cuda GEMM kernels run on the host (threads of a block as host threads, ``__syncthreads`` a barrier)."""

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from embed.builder import GraphBuilder
from embed.evaluate import evaluate
from embed.inputs import random_inputs
from embed.ir import Graph
from embed.lower import lower
from embed.partition import partition
from embed.subgraph import SubgraphKind
from tests.gpu import needs_gpu
from tests.transforms.test_cuda_on_host import WORDS
from transforms.build import Source, build
from transforms.codegen import generate
from transforms.compilers import cuda
from transforms.contraction import VendorPlan, match_contraction, vendor_plan
from transforms.problem import make_problem
from transforms.recipe import parse
from transforms.run import Launch, Trial, Worker, run
from transforms.space import RecipeSpace, default_recipe
from transforms.transformation import apply_recipe
from transforms.tune import make_task
from transforms.views import fold_views


def qkv(b: int = 2, s: int = 12, heads: int = 3, d: int = 4, *, bias: bool = True, perm: list[int] | None = None,
        dtype: str = "float32") -> Graph:
    """x[b, s, h] @ w[h, 3h] (+ bias) -> [b, s, 3, heads, d] (-> transposed by ``perm``): a QKV head split."""
    h = heads * d
    g = GraphBuilder("qkv")
    y = g.node("matmul", [g.input("x", (b, s, h), dtype), g.param("w", (h, 3 * h), dtype)], (b, s, 3 * h), dtype)
    if bias:
        y = g.node("add", [y, g.param("bias", (3 * h,), dtype)], (b, s, 3 * h), dtype)
    split = [b, s, 3, heads, d]
    y = g.node("reshape", [y], split, dtype, shape=split)
    if perm is not None:
        y = g.node("transpose", [y], [split[p] for p in perm], dtype, perm=perm)
    return g.build([y])


def flatten(dtype: str = "float32") -> Graph:
    """[b, heads, s, d] @ [d, n] -> transposed to [b, s, heads, n] -> flattened to [b, s, heads * n], and relu'd
    before the view (the pre-view value is also an output: it stays stored in order)."""
    g = GraphBuilder("flatten")
    y = g.node("matmul", [g.input("x", (2, 3, 5, 8), dtype), g.param("w", (8, 6), dtype)], (2, 3, 5, 6), dtype)
    r = g.node("relu", [y], (2, 3, 5, 6), dtype, name="r")
    t = g.node("transpose", [r], (2, 5, 3, 6), dtype, perm=[0, 2, 1, 3])
    return g.build([r, g.node("reshape", [t], (2, 5, 18), dtype, name="out", shape=[2, 5, 18])])


HEADS_FIRST = [2, 0, 3, 1, 4]  # [3, b, heads, s, d]: q, k and v each [b, heads, s, d]


def graphs(dtype: str = "float32") -> dict[str, Graph]:
    return {
        "head split": qkv(dtype=dtype),
        "head split, no bias": qkv(bias=False, dtype=dtype),
        "heads first": qkv(perm=HEADS_FIRST, dtype=dtype),
        "heads first, no bias": qkv(bias=False, perm=HEADS_FIRST, dtype=dtype),
        "transpose then flatten": flatten(dtype),
    }


GRAPHS = graphs()


def test_a_qkv_projection_with_a_head_split_is_partitioned_and_tuned_as_a_gemm() -> None:
    (sub,) = partition(qkv(b=2, s=64, heads=4, d=32))
    assert sub.kind == SubgraphKind.CONTRACTION and [n.op for n in sub.graph.nodes] == ["matmul", "add", "reshape"]
    program = lower(sub.graph)
    (options,) = RecipeSpace(program, "cuda").dims  # the gemm step is exclusive: nothing but gemm recipes
    assert {s.name for s in options} == {"gemm"} and {s.args[0] for s in options} == {"cublaslt", "cublas", "simt"}
    assert str(default_recipe(program, "cuda")) == "gemm(cublaslt,0)"
    c = match_contraction(program)
    assert c is not None and (c.batch, c.m, c.n, c.k) == ((2,), 64, 384, 128)
    bias, out = sub.graph.inputs[-1], sub.graph.outputs[0]  # canonical names
    assert vendor_plan(c, fold=True) == VendorPlan(1, bias, None, out, c.a.dtype)  # bias and view in cuBLASLt's D
    (launch,) = generate(apply_recipe(parse("gemm(cublaslt,0)"), program), "cuda").launches
    assert launch.library == "cublaslt_matmul"  # nothing left for a kernel: no copy, no epilogue pass


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_every_view_of_a_contraction_keeps_it_a_gemm(name: str) -> None:
    program = lower(GRAPHS[name])
    folded = fold_views(program)
    assert match_contraction(program) is not None and not any(n.op == "reshape" and n.parallel != folded.nests[0]
                                                                  .parallel for n in folded.nests)
    assert fold_views(folded) is folded and folded.buffers == program.buffers  # once; the same kernel arguments
    assert {s.name for d in RecipeSpace(program, "cuda").dims for s in d} == {"gemm"}


def test_programs_without_views_are_left_alone_and_other_views_are_no_gemm() -> None:
    g = GraphBuilder("linear")
    y = g.node("matmul", [g.input("x", (4, 8), "float32"), g.param("w", (8, 6), "float32")], (4, 6), "float32")
    plain = lower(g.build([g.node("relu", [y], (4, 6), "float32")]))
    assert fold_views(plain) is plain
    b = GraphBuilder("softmax")
    s = b.node("softmax", [b.input("x", (4, 8), "float32")], (4, 8), "float32", axis=-1)
    graph = b.build([b.node("reshape", [s], (32,), "float32", shape=[32])])
    viewed = lower(graph)
    inputs = random_inputs(graph, seed=0)
    assert len(fold_views(viewed).nests) == len(viewed.nests) - 1 and match_contraction(viewed) is None
    assert np.array_equal(evaluate(fold_views(viewed), inputs)["t2"], evaluate(viewed, inputs)["t2"])


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_folded_views_compute_what_the_lowered_program_computes(name: str) -> None:
    program = lower(GRAPHS[name])
    inputs = random_inputs(GRAPHS[name], seed=1)
    want, got = evaluate(program, inputs), evaluate(fold_views(program), inputs)
    assert want.keys() == got.keys() and all(np.array_equal(want[k], got[k]) for k in want)


def test_the_transposed_store_goes_element_by_element_after_a_vendor_gemm() -> None:
    program = lower(qkv(perm=HEADS_FIRST))
    c = match_contraction(program)
    assert c is not None and [n.op for n in c.program.nests] == ["matmul", "add", "transpose"]
    assert vendor_plan(c, fold=True) == VendorPlan(1, "bias", None, "t3", c.a.dtype)  # [b, s, 3h] in order first
    lt, epilogue = generate(apply_recipe(parse("gemm(cublaslt,0)"), program), "cuda").launches
    assert lt.library == "cublaslt_matmul" and epilogue.entry == "tb_gemm"
    code = generate(apply_recipe(parse("gemm(cublaslt,0)"), program), "cuda").code
    epilogue_code = code.split("tb_gemm(")[1]  # q, k and v of [2, 3, 12, 4] each, one element a thread:
    assert "k_st" not in epilogue_code and "b3[(((col) / 12)) * 288LL + (z0) * 144LL" in epilogue_code


@pytest.fixture(scope="module")
def worker():
    with Worker() as w:
        yield w


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_cpu_kernels_store_through_the_view_and_compute_the_reference(name: str, worker, tmp_path: Path) -> None:
    graph = GRAPHS[name]
    program = lower(graph)
    folded = fold_views(program)
    kernels = [generate(apply_recipe(recipe, folded), "cpu") for recipe in (default_recipe(folded, "cpu"),
                                                                          parse("fuse(none);parallel(1)"))]
    built = build([Source(k.code, "cpu") for k in kernels], cache_dir=tmp_path)
    problem = make_problem(graph, program, seed=2)  # the reference: the lowered program, in float64
    results = run([Trial(b, k.launches, problem) for b, k in zip(built, kernels, strict=True)], worker=worker,
                  repeats=1, warmup=0)
    assert [r.error for r in results if not r.ok] == []


SHIM = r"""#include <math.h>
#include <pthread.h>
#include <string.h>
#undef INFINITY
#undef NAN
template <class T> static inline T min(T a, T b) { return a < b ? a : b; }
template <class T> static inline T max(T a, T b) { return a < b ? b : a; }
struct k_dim3 { unsigned x, y, z; };
static thread_local k_dim3 threadIdx;
static k_dim3 blockIdx, blockDim, gridDim;
static pthread_barrier_t k_barrier;
""" + WORDS + r"""#define __syncthreads() pthread_barrier_wait(&k_barrier)
#define __shared__ static
#define __global__
#define __device__
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define asm(...) (void)0
static float k_lanes[1024];  // a warp shuffle, as every thread of the block exchanging through statics
static inline float __shfl_xor_sync(unsigned, float v, int lane) {
  k_lanes[threadIdx.x] = v;
  pthread_barrier_wait(&k_barrier);
  float out = k_lanes[threadIdx.x ^ lane];
  pthread_barrier_wait(&k_barrier);
  return out;
}
#define __syncwarp() pthread_barrier_wait(&k_barrier)
"""
KERNEL = re.compile(r'extern "C" __global__ void __launch_bounds__\([^)]*\) (tb_\w+)\((.*?)\) \{')


def threaded_host_source(code: str, launches: tuple[Launch, ...]) -> str:
    """``code`` with a host ``<entry>`` per launch running its grid block by block, each block's threads as POSIX
    threads meeting at ``__syncthreads`` (a barrier; ``__shared__`` arrays are the one running block's statics; a
    warp shuffle or ``__syncwarp`` is the whole block's, so a block of one warp)."""
    params = {m.group(1): m.group(2) for m in KERNEL.finditer(code)}
    body = KERNEL.sub(lambda m: f"static void {m.group(1)}_device({m.group(2)}) {{", code)
    runners = []
    for launch in launches:
        declared = [p.replace("__restrict__ ", "").strip() for p in params[launch.entry].split(",")]
        names = [p.split()[-1] for p in declared]
        held = "\n".join(f"static {p.rsplit(' ', 1)[0]} k_{launch.entry}_{p.split()[-1]};" for p in declared)
        (gx, gy, gz), (bx, _, _) = launch.grid, launch.block
        runners.append(f"""{held}
static void* k_{launch.entry}_thread(void* t) {{
  threadIdx = {{(unsigned)(size_t)t, 0, 0}};
  {launch.entry}_device({", ".join(f"k_{launch.entry}_{n}" for n in names)});
  return 0;
}}
extern "C" void {launch.entry}({", ".join(declared)}) {{
  {" ".join(f"k_{launch.entry}_{n} = {n};" for n in names)}
  gridDim = {{{gx}, {gy}, {gz}}}; blockDim = {{{bx}, 1, 1}};
  pthread_t threads[{bx}];
  for (unsigned z = 0; z < {gz}; z++) for (unsigned y = 0; y < {gy}; y++) for (unsigned x = 0; x < {gx}; x++) {{
    blockIdx = {{x, y, z}};
    pthread_barrier_init(&k_barrier, 0, {bx});
    for (size_t t = 0; t < {bx}; t++) pthread_create(&threads[t], 0, k_{launch.entry}_thread, (void*)t);
    for (unsigned t = 0; t < {bx}; t++) pthread_join(threads[t], 0);
    pthread_barrier_destroy(&k_barrier);
  }}
}}""")
    return SHIM + body + "\n" + "\n".join(runners) + "\n"


HOST_CASES = [  # fp32 simt tiles (mma and the vendor paths need a GPU); split-K adds the parts in a second kernel
    ("head split", "gemm(simt,32,32,8,1,1,1)"),
    ("head split, no bias", "gemm(simt,32,64,8,2,1,4)"),
    ("heads first", "gemm(simt,32,32,8,1,1,1)"),
    ("heads first", "gemm(simt,32,32,2,1,1,1,3)"),  # 6 k tiles in parts of 2: the sum kernel stores the view
    ("heads first, no bias", "gemm(simt,64,32,4,2,1,8)"),
    ("transpose then flatten", "gemm(simt,32,32,8,1,1,1)"),
]


@pytest.mark.skipif(shutil.which("c++") is None, reason="no host C++ compiler")
def test_cuda_gemm_kernels_store_through_the_view_on_the_host(worker, tmp_path: Path) -> None:
    kernels, problems = [], []
    for name, recipe in HOST_CASES:
        program = lower(GRAPHS[name])
        kernels.append(generate(apply_recipe(parse(recipe), program), "cuda"))
        problems.append(make_problem(GRAPHS[name], program, seed=4))
    options = ("-x", "c++", "-pthread", "-w", "-O1")
    sources = [Source(threaded_host_source(k.code, k.launches), "cpu", options=options) for k in kernels]
    built = build(sources, cache_dir=tmp_path)
    assert [(case, b.error[:2000]) for case, b in zip(HOST_CASES, built, strict=True) if not b.ok] == []
    assert [len(k.launches) for k in kernels] == [1, 1, 1, 2, 1, 1]
    results = run([Trial(b, k.launches, p) for b, k, p in zip(built, kernels, problems, strict=True)], worker=worker,
                  repeats=1, warmup=0)
    assert [(case, r.error) for case, r in zip(HOST_CASES, results, strict=True) if not r.ok] == []


def layer_norm_windows() -> Graph:
    """A layer norm over the 72 rows of [2, 6, 6, 8], reshaped into windows [2, 3, 2, 3, 2, 8] (swin's first step)."""
    g = GraphBuilder("windows")
    norm = g.node("layer_norm", [g.input("x", (2, 6, 6, 8), "float32"), g.param("w", (8,), "float32"),
                                 g.param("b", (8,), "float32")], (2, 6, 6, 8), "float32", axes=[3], eps=1e-5)
    return g.build([g.node("reshape", [norm], (2, 3, 2, 3, 2, 8), "float32", shape=[2, 3, 2, 3, 2, 8])])


@pytest.mark.skipif(shutil.which("c++") is None, reason="no host C++ compiler")
def test_a_row_reduction_stores_through_its_view_with_a_block_per_row(worker, tmp_path: Path) -> None:
    graph = layer_norm_windows()
    (subgraph,) = partition(graph)
    assert subgraph.kind == SubgraphKind.REDUCTION
    recipe = parse("fuse(all);reduce(block);row_depth(0);rows_per_block(1);threads(32);unroll(1)")
    kernel = generate(apply_recipe(recipe, make_task(subgraph).program), "cuda")
    (launch,) = kernel.launches
    assert launch.grid == (2 * 6 * 6, 1, 1)  # unfolded, the reshape's nest made its leading axis (2) the rows
    options = ("-x", "c++", "-pthread", "-w", "-O1")
    (built,) = build([Source(threaded_host_source(kernel.code, kernel.launches), "cpu", options=options)],
                     cache_dir=tmp_path)
    problem = make_problem(graph, lower(graph), seed=3)  # the reference: the unfolded program, in float64
    (result,) = run([Trial(built, kernel.launches, problem)], worker=worker, repeats=1, warmup=0)
    assert result.ok, result.error


PTX_RECIPES = ("gemm(cublaslt,0)", "gemm(cublas)", "gemm(simt,64,64,16,4,1,8)", "gemm(mma,64,64,32,4,2,1)",
               "gemm(mma,64,64,32,4,2,1,2)")


@pytest.mark.skipif(not cuda.available(), reason="no NVRTC or nvcc")
def test_gemm_kernels_with_views_compile_to_ptx(tmp_path: Path) -> None:
    cases, kernels = [], []
    for dtype in ("float32", "float16"):
        for name, graph in graphs(dtype).items():
            program = lower(graph)
            space = {s for d in RecipeSpace(program, "cuda").dims for s in d}
            for recipe in (r for r in PTX_RECIPES if parse(r).steps[0] in space):
                cases.append((name, dtype, recipe))
                kernels.append(generate(apply_recipe(parse(recipe), program), "cuda"))
    results = build([Source(k.code, "cuda") for k in kernels], cache_dir=tmp_path)
    assert [(case, r.error[:400]) for case, r in zip(cases, results, strict=True) if not r.ok] == []
    assert {r for _, t, r in cases if t == "float16"} >= {"gemm(mma,64,64,32,4,2,1)", "gemm(cublaslt,0)"}


GPU_RECIPES = {"float32": ("gemm(cublaslt,0)", "gemm(cublas)", "gemm(simt,64,64,16,4,1,8)",
                           "gemm(simt,32,32,2,1,1,1,2)"),
               "float16": ("gemm(cublaslt,0)", "gemm(cublas)", "gemm(mma,64,64,32,4,2,1)")}
GPU_CASES = [(name, dtype, recipe) for dtype, recipes in GPU_RECIPES.items() for name in sorted(GRAPHS)
             for recipe in recipes]


@needs_gpu
@pytest.mark.parametrize(("name", "dtype", "recipe"), GPU_CASES)
def test_gemm_kernels_with_views_validate_on_the_gpu(tmp_path: Path, name: str, dtype: str, recipe: str) -> None:
    from tests.transforms.kernels import measure

    (result,) = measure(graphs(dtype)[name], [recipe], tmp_path, backend="cuda")
    assert result.ok, result.error
