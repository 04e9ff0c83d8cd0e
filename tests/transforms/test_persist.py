"""``persist(B)``: persistent row kernels (a grid of B blocks per SM looping over rows, the next row prefetched)."""

import re
from pathlib import Path

import pytest

from embed.builder import GraphBuilder
from embed.ir import Graph
from embed.lower import lower
from tests.gpu import needs_gpu
from tests.transforms.kernels import single
from transforms.build import Source, build
from transforms.codegen import generate
from transforms.codegen.cuda_split import SMS
from transforms.compilers import cuda
from transforms.recipe import parse
from transforms.schedule import ScheduleError
from transforms.space import RecipeSpace, default_recipe
from transforms.steps.persist import BLOCKS
from transforms.transformation import apply_recipe

BASE = "fuse(all);threads(256);reduce(block);row_mode(registers);vectorize(8)"


def _norm(op: str, shape: tuple[int, ...], dtype: str = "float16", residual: bool = False) -> Graph:
    """``op`` (layer_norm | rms_norm) over the last axis of ``shape``, of ``x`` or (``residual``) ``x + r``."""
    b = GraphBuilder(op)
    n = shape[-1]
    x = b.input("x", shape, dtype)
    if residual:
        x = b.node("add", [x, b.input("r", shape, dtype)], shape, dtype)
    params = [b.input("w", (n,), dtype)] + ([b.input("b", (n,), dtype)] if op == "layer_norm" else [])
    return b.build([b.node(op, [x, *params], shape, dtype, name="out", axes=[len(shape) - 1], eps=1e-5)])


def _softmax(shape: tuple[int, ...], dtype: str = "float16") -> Graph:
    return single("softmax", [("x", shape, dtype)], shape, dtype, axis=-1)


def test_persist_is_offered_for_row_groups_and_off_by_default() -> None:
    program = lower(_norm("layer_norm", (64, 768)))
    assert [s.args[0] for g in RecipeSpace(program, "cuda").dims for s in g if s.name == "persist"] == list(BLOCKS)
    assert "persist(0)" in str(default_recipe(program, "cuda"))
    with pytest.raises(ScheduleError):
        apply_recipe(parse("persist(5)"), program)


def test_persist_zero_generates_the_plain_kernel() -> None:
    program = lower(_norm("layer_norm", (64, 768)))
    assert generate(apply_recipe(parse(f"{BASE};persist(0)"), program), "cuda") == \
        generate(apply_recipe(parse(BASE), program), "cuda")


def test_persistent_grid_and_prefetched_words() -> None:
    program = lower(_norm("layer_norm", (8192, 768), residual=True))
    kernel = generate(apply_recipe(parse(f"{BASE};persist(2)"), program), "cuda")
    (launch,) = kernel.launches
    assert (launch.grid, launch.block) == ((2 * SMS, 1, 1), (256, 1, 1))  # 8 rows a block, 1024 blocks' worth
    assert "__launch_bounds__(256, 2)" in kernel.code and "k_base += k_stride" in kernel.code
    body = kernel.code.split("k_base += k_stride")[1]
    # x and r (3 chunks of 16 bytes a lane each) are loaded a row ahead into kf0..kf5 and used from their copies;
    # w and b (the same for every row) are the loop's only other 16-byte loads
    assert body.count("= *(const uint4*)") == 12 and len(re.findall(r"kf\d_0 = \*", body)) == 6
    assert "kf5_0c.w" in body and "(b0 + (i" not in body.split("kf5_0 =")[1]
    two = generate(apply_recipe(parse("fuse(all);threads(128);reduce(block);rows_per_block(2);row_mode(registers);"
                                      "vectorize(8);persist(2)"), program), "cuda").code
    assert "if (k_next < 8192 && kc1 < 768) { kf1_0 = " in two  # 64 lanes: the second chunk ends past the row
    online = generate(apply_recipe(parse(f"{BASE};row_mode(online);persist(2)"), program), "cuda").code
    assert "kf0" not in online and "k_next = row + k_stride;" in online  # streamed rows: no prefetch, same loop
    small = generate(apply_recipe(parse(f"{BASE};persist(4)"), lower(_norm("layer_norm", (20, 768)))), "cuda")
    assert small.launches[0].grid == (3, 1, 1)  # never more blocks than the rows need


@pytest.mark.skipif(not cuda.available(), reason="no NVRTC or nvcc")
def test_persistent_kernels_compile(tmp_path: Path) -> None:
    graphs = [_norm("layer_norm", (1001, 768)), _norm("rms_norm", (7, 33, 512), "bfloat16"),
              _norm("layer_norm", (999, 776), "float32", residual=True), _softmax((4099, 128)),
              _softmax((301, 4000))]
    recipes = [f"fuse(all);threads({t});reduce({r});row_mode({m});vectorize({v});persist({p})"
               for m in ("registers", "online", "stream", "shared") for p in BLOCKS[1:] for t, r, v in
               ((256, "block", 8), (128, "warp", 4), (64, "lanes,4", 2))]
    labels, sources = [], []
    for graph in graphs:
        program = lower(graph)
        for recipe in recipes:
            labels.append(f"{graph.name} {recipe}")
            sources.append(Source(generate(apply_recipe(parse(recipe), program), "cuda").code, "cuda"))
    results = build(sources, cache_dir=tmp_path)
    assert [(label, r.error[:300]) for label, r in zip(labels, results, strict=True) if not r.ok] == []


PERSIST_RECIPES = [
    f"{BASE};persist(2)",
    f"{BASE};persist(4)",
    "fuse(all);threads(128);reduce(warp);rows_per_block(4);row_mode(registers);vectorize(4);persist(2)",
    "fuse(all);threads(512);reduce(block);row_mode(registers);vectorize(8);persist(4)",
    "fuse(all);threads(256);reduce(block);row_mode(shared);vectorize(8);persist(2)",
    "fuse(all);threads(64);reduce(lanes,8);rows_per_block(2);row_mode(online);vectorize(2);persist(8)",
]


@needs_gpu
@pytest.mark.parametrize("graph", ["layernorm", "rmsnorm_bf16", "add_layernorm_fp32", "softmax_3d"])
def test_persistent_kernels_validate_on_the_gpu(tmp_path: Path, graph: str) -> None:
    from tests.transforms.kernels import measure

    # row counts that leave the last stride of the grid partly empty (1056 rows a stride at 8 rows a block)
    g = {"layernorm": _norm("layer_norm", (8193, 768)), "rmsnorm_bf16": _norm("rms_norm", (3, 1001, 512), "bfloat16"),
         "add_layernorm_fp32": _norm("layer_norm", (2111, 776), "float32", residual=True),
         "softmax_3d": _softmax((5, 977, 1000))}[graph]
    results = measure(g, PERSIST_RECIPES, tmp_path, backend="cuda")
    assert [(r, x.error[:200]) for r, x in zip(PERSIST_RECIPES, results, strict=True) if not x.ok] == []
