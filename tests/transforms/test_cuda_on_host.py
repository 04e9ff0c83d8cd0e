"""Generated CUDA row kernels run on the host: their numbers checked without a GPU.

A row kernel whose reduction runs in one thread per row (``reduce(thread)``: no shared memory, no shuffles, no
barriers) does not depend on how its threads interleave, so the generated source, unchanged, compiles as C++ beside
a small shim (``threadIdx`` and friends as globals, the vector types and bit casts) with one host function per
launch that runs the kernel for every block and thread in turn. The cpu worker then runs those launches and checks
them against the float64 reference with the same check as every candidate: the cuda row math (Welford and online
softmax merges, chunked loads, epilogues) fails ``make test`` when it is wrong. float32 rows only (fp16 conversions
are inline PTX).
"""

import re
from pathlib import Path

import pytest

from embed.builder import GraphBuilder
from embed.ir import Graph
from embed.lower import lower
from transforms.build import Source, build
from transforms.codegen import generate
from transforms.problem import make_problem
from transforms.recipe import parse
from transforms.run import Launch, Trial, Worker, run
from transforms.transformation import apply_recipe

#: CUDA's vector word types and bit casts, as host C++ (after ``#include <string.h>``).
WORDS = r"""struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
"""
SHIM = r"""#include <math.h>
#include <string.h>
#undef INFINITY
#undef NAN
struct k_dim3 { unsigned x, y, z; };
static k_dim3 threadIdx, blockIdx, blockDim, gridDim;
""" + WORDS + r"""#define __global__
#define __device__
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define asm(...) (void)0
"""
KERNEL = re.compile(r'extern "C" __global__ void __launch_bounds__\([^)]*\) (tb_kernel\d+)\((.*?)\) \{')


def host_source(code: str, launches: tuple[Launch, ...]) -> str:
    """``code`` with each kernel renamed ``<entry>_device`` and a host ``<entry>`` that runs its whole grid."""
    assert not re.search(r"__shfl|__syncthreads|__syncwarp|__shared__|atomic", code), "threads would interact"
    params = {m.group(1): m.group(2) for m in KERNEL.finditer(code)}
    body = KERNEL.sub(lambda m: f"static void {m.group(1)}_device({m.group(2)}) {{", code)
    runners = []
    for launch in launches:
        names = ", ".join(p.split()[-1] for p in params[launch.entry].split(","))
        (gx, gy, gz), (bx, by, bz) = launch.grid, launch.block
        runners.append(f"""extern "C" void {launch.entry}({params[launch.entry]}) {{
  gridDim = {{{gx}, {gy}, {gz}}}; blockDim = {{{bx}, {by}, {bz}}};
  for (unsigned z = 0; z < {gz}; z++) for (unsigned y = 0; y < {gy}; y++) for (unsigned x = 0; x < {gx}; x++)
    for (unsigned tz = 0; tz < {bz}; tz++) for (unsigned ty = 0; ty < {by}; ty++)
      for (unsigned tx = 0; tx < {bx}; tx++) {{
      blockIdx = {{x, y, z}}; threadIdx = {{tx, ty, tz}};
      {launch.entry}_device({names});
    }}
}}""")
    return SHIM + body + "\n" + "\n".join(runners) + "\n"


def scaled(op: str, shape: tuple[int, int], scale: float, **attrs) -> Graph:
    """``op(x * scale)`` over rows, with ``weight`` and ``bias`` for the norms: logits far apart when ``scale`` is
    large (a running max that misses one overflows ``exp``)."""
    b = GraphBuilder(op)
    x = b.input("x", shape, "float32")
    y = b.node("mul", [x, b.const(scale, "float32")], shape, "float32")
    extra = [b.param(n, shape[-1:], "float32") for n in ("weight", "bias")] if op == "layer_norm" else []
    extra += [b.param("weight", shape[-1:], "float32")] if op == "rms_norm" else []
    return b.build([b.node(op, [y, *extra], shape, "float32", name="out", **attrs)])


GRAPHS = {
    "softmax": scaled("softmax", (6, 300), 100.0, axis=-1),
    "log_softmax": scaled("log_softmax", (5, 260), 100.0, axis=-1),
    "layer_norm": scaled("layer_norm", (6, 300), 1.0, axes=[-1], eps=1e-5),
    "rms_norm": scaled("rms_norm", (5, 300), 1.0, axes=[-1], eps=1e-6),
}
MODES = ("registers", "online", "stream")
RECIPES = [f"fuse(all);reduce(thread);row_mode({mode});rows_per_block(1);threads(32);vectorize({v});unroll({u})"
           for mode in MODES for v, u in ((1, 1), (4, 2))]


@pytest.fixture(scope="module")
def worker():
    with Worker() as w:
        yield w


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_thread_per_row_cuda_kernels_compute_the_reference_on_the_host(name: str, worker, tmp_path: Path) -> None:
    graph = GRAPHS[name]
    program = lower(graph)
    problem = make_problem(graph, program, seed=3)
    kernels = [generate(apply_recipe(parse(r), program), "cuda") for r in RECIPES]
    built = build([Source(host_source(k.code, k.launches), "cpu", options=("-x", "c++", "-w")) for k in kernels],
                  cache_dir=tmp_path)
    assert [(r, b.error[:2000]) for r, b in zip(RECIPES, built, strict=True) if not b.ok] == []
    results = run([Trial(b, k.launches, problem) for b, k in zip(built, kernels, strict=True)], worker=worker,
                  repeats=1, warmup=0)
    assert [(r, res.error) for r, res in zip(RECIPES, results, strict=True) if not res.ok] == []
