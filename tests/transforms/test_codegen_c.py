"""Generated C against the float64 reference: every zoo subgraph kind and op, default and random recipes."""

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embed import zoo
from embed.builder import GraphBuilder
from embed.ir import Graph
from embed.lower import lower
from embed.partition import partition
from embed.subgraph import Subgraph
from tests.transforms.kernels import measure, single
from transforms.build import Source, build
from transforms.codegen import generate
from transforms.recipe import parse
from transforms.run import Problem, Trial, Worker, run
from transforms.space import RecipeSpace, default_recipe
from transforms.transformation import apply_recipe
from transforms.tune import make_task

#: The smallest point of each zoo family, shrunk further so the suite stays fast.
MODELS = (
    "bert_encoder-h64-s16-b1", "gpt_decoder-h64-s16-b1", "llama_block-h64-s16-b1", "vit_block-h64-i32-b1",
    "resnet_stem-i32-b1", "resnet_basic-c8-i8-b1", "resnet_bottleneck-c8-i8-b1", "convnext_block-c8-i8-b1",
    "cnn_head-c16-i7-b1", "gcn-n64-f16-d0.05", "lm_head-h32-v100-t16", "mixer_block-h32-s16-b1",
)


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    with Worker() as w:
        yield w


@pytest.fixture(scope="module")
def subgraphs() -> list[Subgraph]:
    seen: dict[str, Subgraph] = {}
    for name in MODELS:
        for sub in partition(zoo.load(name)):
            if sub.tunable:
                seen.setdefault(sub.structural_hash, sub)
    return list(seen.values())


def test_zoo_default_and_random_recipes_validate(subgraphs: list[Subgraph], worker: Worker, tmp_path: Path) -> None:
    kinds = {s.kind.value for s in subgraphs}
    assert kinds == {"pointwise", "reduction", "contraction", "convolution", "sparse", "layout"}
    rng = random.Random(0)
    failures = []
    for sub in subgraphs:
        program = lower(sub.graph)
        space = RecipeSpace(program)
        recipes = [default_recipe(program), space.sample(rng), space.sample(rng)]
        for recipe, result in zip(recipes, measure(sub.graph, recipes, tmp_path, worker), strict=True):
            if not result.ok:
                failures.append(f"{sub.kind.value} {sub.ops} {recipe}: {result.error_kind} {result.error[:200]}")
    assert not failures, "\n".join(failures)


def _layer_norm(dtype: str) -> Graph:
    b = GraphBuilder("ln")
    x, w, bias = b.input("x", (6, 40), dtype), b.param("w", (40,), dtype), b.param("b", (40,), dtype)
    return b.build([b.node("layer_norm", [x, w, bias], (6, 40), dtype, name="out", axes=[-1], eps=1e-5)])


def _conv() -> Graph:
    b = GraphBuilder("conv")
    x, w = b.input("x", (2, 4, 9, 9), "float32"), b.param("w", (6, 2, 3, 3), "float32")
    out = b.node("conv2d", [x, w], (2, 6, 5, 5), "float32", name="out", stride=[2], padding=[2], dilation=[2], groups=2)
    return b.build([out])


CASES = {
    **{f"softmax-{d}": single("softmax", [("x", (5, 33), d)], (5, 33), d, axis=-1)
       for d in ("float16", "bfloat16", "float64")},
    **{f"layer_norm-{d}": _layer_norm(d) for d in ("float16", "bfloat16")},
    "gather": single("gather", [("x", (7, 9), "float32"), ("i", (4, 3), "int64")], (4, 3, 9), axis=0),
    "where": single("where", [("c", (3, 1), "bool"), ("a", (3, 5), "float32"), ("b", (5,), "float32")], (3, 5)),
    "max_pool": single("max_pool2d", [("x", (2, 3, 9, 9), "float32")], (2, 3, 5, 5), kernel=[3], stride=[2],
                       padding=[1]),
    "conv_groups_dilation_padding": _conv(),
    "reduce_all": single("reduce_max", [("x", (5, 7), "float32")], (), axes=[]),
    "reduce_middle": single("reduce_sum", [("x", (4, 6, 5), "float32")], (4, 5), axes=[1]),
    "reshape_div_mod": single("reshape", [("x", (6, 10), "float32")], (4, 15), shape=[4, 15]),
    "concat": single("concat", [("a", (3, 4), "float32"), ("b", (3, 2), "float32")], (3, 6), axis=1),
    "slice_step": single("slice", [("x", (5, 12), "float32")], (5, 4), axis=1, start=1, end=12, step=3),
    "cast_int": single("cast", [("x", (5, 12), "float32")], (5, 12), "int32", dtype="int32"),
    "nll_none": single("nll_loss", [("x", (6, 9), "float32"), ("t", (6,), "int64")], (6,), reduction="none"),
    "pow_broadcast": single("pow", [("x", (6, 9), "float32"), ("y", (9,), "float32")], (6, 9)),
    "matvec": single("matmul", [("x", (6, 9), "float32"), ("y", (9,), "float32")], (6,)),
    "gelu_tanh_fp16": single("gelu", [("x", (3, 17), "float16")], (3, 17), "float16", approximate="tanh"),
    **{op: single(op, [("x", (3, 17), "float32")], (3, 17))
       for op in ("exp", "log", "rsqrt", "sigmoid", "silu", "erf", "sin", "reciprocal")},
}
RECIPES = (
    "fuse(all);parallel(2);tile(p0,4);tile(p1,2);vectorize(8);reduce(simd)",
    "fuse(outer);reorder(p0,p1);tile(p0,16);unroll(4);reduce(lanes,4)",
    "fuse(none);parallel(1);tile(p1,8);reduce(lanes,2)",
)


@pytest.mark.parametrize("case", sorted(CASES))
def test_ops_and_dtypes_validate(case: str, worker: Worker, tmp_path: Path) -> None:
    graph = CASES[case]
    recipes = [default_recipe(lower(graph)), *RECIPES]
    results = measure(graph, recipes, tmp_path, worker)
    assert [(str(r), x.error_kind) for r, x in zip(recipes, results, strict=True) if not x.ok] == []
    assert all(x.max_rel_err is not None and x.max_rel_err < 0.05 for x in results)


def test_wrong_code_is_caught(worker: Worker, tmp_path: Path) -> None:
    graph = single("sub", [("a", (4, 8), "float32"), ("b", (4, 8), "float32")], (4, 8))
    task = make_task(graph)
    kernel = generate(apply_recipe(parse("parallel(1)"), task.program))
    assert "b0[" in kernel.code and "b1[" in kernel.code
    broken = kernel.code.replace("b0[", "b1[")  # reads the wrong operand: b - b
    builds = build([Source(kernel.code), Source(broken)], cache_dir=tmp_path)
    good, bad = run([Trial(b, kernel.launches[0], task.problem) for b in builds], worker=worker, repeats=1)
    assert good.ok and good.max_rel_err is not None and good.max_rel_err < 1e-6
    assert bad.error_kind == "wrong"


def test_source_holds_no_document_strings() -> None:
    b = GraphBuilder("evil")
    x = b.input("x; system(1);", (4, 8), "float32")
    graph = b.build([b.node("relu", [x], (4, 8), "float32", name="y */ evil(); /*")])
    code = generate(apply_recipe(parse("fuse(all)"), lower(graph))).code
    assert "system" not in code and "evil" not in code


def test_integer_outputs_are_exact_beyond_float32s_24_bits(tmp_path: Path, worker: Worker) -> None:
    # int64 offsets added to indices (an embedding's): past 2**24 a float32 sum rounds to a neighbouring integer
    task = make_task(single("add", [("x", (64,), "int64"), ("y", (64,), "int64")], (64,), "int64"))
    kernel = generate(apply_recipe(default_recipe(task.program), task.program), "cpu")
    [built] = build([Source(kernel.code, "cpu")], cache_dir=tmp_path)
    x = (1 << 40) + 7 * np.arange(64, dtype=np.int64) + 1
    y = np.full(64, 3, dtype=np.int64)
    [out] = task.problem.reference
    problem = Problem(dict(zip(sorted(task.problem.inputs), (x, y), strict=True)), {out: x + y})
    [result] = run([Trial(built, kernel.launches, problem)], worker=worker, repeats=1)
    assert result.ok and result.max_rel_err == 0.0, result.error
