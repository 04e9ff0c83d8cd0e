"""CUDA generation compiles to PTX for every zoo subgraph (default and random recipes); no GPU needed."""

import random
import re
from pathlib import Path

import pytest

from embed import zoo
from embed.lower import lower
from embed.partition import partition
from tests.transforms.kernels import single
from transforms.build import Source, build
from transforms.codegen import generate
from transforms.compilers import cuda
from transforms.recipe import parse
from transforms.space import RecipeSpace, default_recipe
from transforms.transformation import apply_recipe

pytestmark = pytest.mark.skipif(not cuda.available(), reason="no NVRTC or nvcc")
MODELS = ("bert_encoder-h64-s16-b1", "llama_block-h64-s16-b1", "resnet_bottleneck-c8-i8-b1", "gcn-n64-f16-d0.05",
          "lm_head-h32-v100-t16", "convnext_block-c8-i8-b1")


def test_zoo_subgraphs_compile_to_ptx(tmp_path: Path) -> None:
    rng = random.Random(0)
    sources, labels = [], []
    for model in MODELS:
        for sub in partition(zoo.load(model)):
            program = lower(sub.graph)
            space = RecipeSpace(program, "cuda")
            for recipe in (default_recipe(program, "cuda"), space.sample(rng)):
                sources.append(Source(generate(apply_recipe(recipe, program), "cuda").code, "cuda"))
                labels.append(f"{sub.ops} {recipe}")
    results = build(sources, cache_dir=tmp_path)
    assert [(label, r.error[:300]) for label, r in zip(labels, results, strict=True) if not r.ok] == []
    assert all(Path(r.artifact).read_text().count(".entry") >= 1 for r in results if r.artifact)


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


def _gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs an NVIDIA GPU with CuPy")
@pytest.mark.parametrize("recipe", ["", "fuse(none);reduce(thread)", "fuse(all);reduce(warp);rows_per_block(4)",
                                    "fuse(all);threads(512);reduce(block);rows_per_block(2);unroll(4)",
                                    "fuse(none);reduce(warp);row_depth(1)"])
def test_generated_cuda_validates_on_the_gpu(tmp_path: Path, recipe: str) -> None:
    from tests.transforms.kernels import measure

    graph = single("softmax", [("x", (300, 1000), "float16")], (300, 1000), "float16", axis=-1)
    (result,) = measure(graph, [recipe], tmp_path, backend="cuda")
    assert result.ok, result.error
    assert result.max_rel_err < 1e-2 and 0 < result.median_s < 1e-3
