"""evaluate(lower(graph)) against PyTorch in float64, op by op, and against run_eager on the zoo."""

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from embed import zoo
from embed.builder import GraphBuilder
from embed.eager import run_eager
from embed.evaluate import EvaluationError, evaluate, evaluate_steps
from embed.inputs import random_inputs
from embed.ir import Graph
from embed.loopnest import Access, Affine, Call, FloorDiv, Load, Mod
from embed.lower import lower
from embed.partition import partition
from embed.zoo.family import FAMILIES
from tests.gpu import needs_gpu

Spec = tuple[str, Sequence[int], str]  # (name, shape, dtype) of a graph input
P1, P0, R0 = Affine.of("p1"), Affine.of("p0"), Affine.of("r0")


def single(op: str, inputs: Sequence[Spec], out_shape: Sequence[int], out_dtype: str = "float32", **attrs) -> Graph:
    b = GraphBuilder(op)
    names = [b.input(n, s, d) for n, s, d in inputs]
    return b.build([b.node(op, names, out_shape, out_dtype, name="out", **attrs)])


def rand(shape: Sequence[int], seed: int, positive: bool = False) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(shape)
    return np.abs(x) + 0.5 if positive else x


def check(graph: Graph, inputs: dict[str, np.ndarray], reference: Callable[..., torch.Tensor]) -> None:
    got = evaluate(lower(graph), inputs)["out"]
    want = reference(*(torch.from_numpy(np.asarray(inputs[n])) for n in graph.inputs)).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


UNARY = {
    "neg": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "silu": F.silu, "abs": torch.abs,
    "reciprocal": torch.reciprocal, "erf": torch.erf, "cos": torch.cos, "sin": torch.sin, "identity": torch.clone,
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op: str) -> None:
    x = rand((3, 17), 1, positive=op in ("log", "sqrt", "rsqrt", "reciprocal")) * 3
    check(single(op, [("x", (3, 17), "float32")], (3, 17)), {"x": x}, UNARY[op])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate: str) -> None:
    x = rand((5, 9), 2) * 3
    g = single("gelu", [("x", (5, 9), "float32")], (5, 9), approximate=approximate)
    check(g, {"x": x}, lambda t: F.gelu(t, approximate=approximate))


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum,
}


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_broadcast(op: str) -> None:
    g = single(op, [("a", (4, 1, 5), "float32"), ("b", (3, 5), "float32")], (4, 3, 5))
    check(g, {"a": rand((4, 1, 5), 3, positive=op == "pow"), "b": rand((3, 5), 4)}, BINARY[op])


def test_where_and_scalar_const() -> None:
    b = GraphBuilder("w")
    c, x, y = b.input("c", (2, 3), "bool"), b.input("x", (2, 3), "float32"), b.input("y", (3,), "float32")
    w = b.node("where", [c, x, y], (2, 3), "float32")
    out = b.node("mul", [w, b.const(2.5, "float32")], (2, 3), "float32", name="out")
    g = b.build([out])
    cond = np.array([[True, False, True], [False, False, True]])
    check(g, {"c": cond, "x": rand((2, 3), 5), "y": rand((3,), 6)}, lambda c, x, y: torch.where(c, x, y) * 2.5)


def test_cast() -> None:
    x = rand((4, 6), 7) * 5
    check(single("cast", [("x", (4, 6), "float32")], (4, 6), "int64", dtype="int64"), {"x": x},
          lambda t: t.to(torch.int64))
    got = evaluate(lower(single("cast", [("x", (4, 6), "float32")], (4, 6), "int64", dtype="int64")), {"x": x})
    assert got["out"].dtype == np.int64
    i = np.arange(24).reshape(4, 6) - 12
    check(single("cast", [("x", (4, 6), "int64")], (4, 6), "float16", dtype="float16"), {"x": i}, lambda t: t.double())


def test_batch_norm() -> None:
    specs = [("x", (2, 3, 4, 5), "float32")] + [(n, (3,), "float32") for n in ("m", "v", "w", "b")]
    data = {"x": rand((2, 3, 4, 5), 8), "m": rand((3,), 9), "v": rand((3,), 10, True), "w": rand((3,), 11),
            "b": rand((3,), 12)}
    check(single("batch_norm", specs, (2, 3, 4, 5), eps=1e-3), data,
          lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False, eps=1e-3))


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min"])
@pytest.mark.parametrize(("axes", "keepdim", "out_shape"), [([1], False, (3, 5)), ([0, -1], True, (1, 4, 1)),
                                                          ([], False, ())])
def test_reduce(op: str, axes: list[int], keepdim: bool, out_shape: tuple[int, ...]) -> None:
    fn = {"reduce_sum": torch.sum, "reduce_mean": torch.mean, "reduce_max": torch.amax, "reduce_min": torch.amin}[op]
    dims = axes or [0, 1, 2]
    check(single(op, [("x", (3, 4, 5), "float32")], out_shape, axes=axes, keepdim=keepdim), {"x": rand((3, 4, 5), 13)},
          lambda t: fn(t, dim=dims, keepdim=keepdim))


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [1, -1])
def test_softmax(op: str, axis: int) -> None:
    fn = torch.softmax if op == "softmax" else torch.log_softmax
    check(single(op, [("x", (3, 7, 5), "float32")], (3, 7, 5), axis=axis), {"x": rand((3, 7, 5), 14) * 4},
          lambda t: fn(t, axis))


@pytest.mark.parametrize("params", [0, 1, 2])
def test_layer_norm(params: int) -> None:
    specs = [("x", (4, 3, 6), "float32"), ("w", (3, 6), "float32"), ("b", (3, 6), "float32")][: params + 1]
    data = {"x": rand((4, 3, 6), 15) * 2 + 1, "w": rand((3, 6), 16), "b": rand((3, 6), 17)}
    g = single("layer_norm", specs, (4, 3, 6), axes=[-2, -1], eps=1e-5)
    check(g, data, lambda x, *p: F.layer_norm(x, [3, 6], *p, eps=1e-5))


def test_evaluated_a_nest_at_a_time_it_yields_after_each_nest_and_returns_the_outputs() -> None:
    program = lower(single("layer_norm", [("x", (4, 3, 6), "float32")], (4, 3, 6), axes=[-2, -1], eps=1e-5))
    x = rand((4, 3, 6), 15)
    steps, yielded = evaluate_steps(program, {"x": x}), 0
    while True:
        try:
            next(steps)
            yielded += 1
        except StopIteration as done:
            outputs = done.value
            break
    assert len(program.nests) > 1 and yielded == len(program.nests)
    want = F.layer_norm(torch.from_numpy(x), [3, 6], eps=1e-5).numpy()
    np.testing.assert_allclose(outputs["out"], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("weighted", [False, True])
def test_rms_norm(weighted: bool) -> None:
    specs = [("x", (5, 8), "float32"), ("w", (8,), "float32")][: 1 + weighted]
    g = single("rms_norm", specs, (5, 8), axes=[1], eps=1e-6)
    check(g, {"x": rand((5, 8), 18), "w": rand((8,), 19)}, lambda x, *w: F.rms_norm(x, [8], *w, eps=1e-6))


@pytest.mark.parametrize(("reduction", "shape"), [("mean", ()), ("sum", ()), ("none", (6,))])
def test_nll_loss(reduction: str, shape: tuple[int, ...]) -> None:
    g = single("nll_loss", [("p", (6, 4), "float32"), ("t", (6,), "int64")], shape, reduction=reduction)
    data = {"p": rand((6, 4), 20), "t": np.array([0, 3, 1, 1, 2, 3])}
    check(g, data, lambda p, t: F.nll_loss(p, t, reduction=reduction))


@pytest.mark.parametrize(("sa", "sb", "tb", "out"), [
    ((2, 3, 4, 5), (3, 5, 6), False, (2, 3, 4, 6)),
    ((1, 4, 5), (3, 5, 6), False, (3, 4, 6)),
    ((5,), (2, 5, 6), False, (2, 6)),
    ((4, 5), (5,), False, (4,)),
    ((4, 5), (6, 5), True, (4, 6)),
    ((7, 1), (1, 9), False, (7, 9)),
])
def test_matmul(sa: tuple[int, ...], sb: tuple[int, ...], tb: bool, out: tuple[int, ...]) -> None:
    g = single("matmul", [("a", sa, "float32"), ("b", sb, "float32")], out, transpose_b=tb)
    check(g, {"a": rand(sa, 21), "b": rand(sb, 22)}, lambda a, b: torch.matmul(a, b.transpose(-1, -2) if tb else b))


@pytest.mark.parametrize(("xs", "ws", "stride", "padding", "dilation", "groups", "bias"), [
    ((2, 3, 9, 8), (4, 3, 3, 3), [2, 2], [1, 1], [1, 1], 1, True),
    ((1, 4, 10, 10), (6, 2, 3, 2), [1, 2], [0, 2], [2, 1], 2, False),
    ((2, 4, 7, 7), (4, 1, 3, 3), [1, 1], [1, 1], [1, 1], 4, True),
    ((1, 2, 6, 7), (3, 2, 2, 3), [1, 1], [1, 0, 2, 1], [1, 1], 1, True),
    ((6, 5, 4), (3, 2, 1, 1), [1, 1], [0, 0], [1, 1], 3, False),
])
def test_conv2d(xs, ws, stride, padding, dilation, groups, bias) -> None:
    x = torch.from_numpy(rand(xs, 23))
    w = torch.from_numpy(rand(ws, 24))
    bv = torch.from_numpy(rand((ws[0],), 25))
    pad = padding if len(padding) == 2 else [0, 0]
    xp = F.pad(x, (padding[1], padding[3], padding[0], padding[2])) if len(padding) == 4 else x
    want = F.conv2d(xp, w, bv if bias else None, stride, pad, dilation, groups)
    specs = [("x", xs, "float32"), ("w", ws, "float32"), *([("b", (ws[0],), "float32")] if bias else [])]
    g = single("conv2d", specs, tuple(want.shape), stride=stride, padding=padding, dilation=dilation, groups=groups)
    check(g, {"x": x.numpy(), "w": w.numpy(), "b": bv.numpy()}, lambda *_: want)


@pytest.mark.parametrize(("op", "kernel", "stride", "padding"), [
    ("max_pool2d", [3, 3], [2, 2], [1, 1]),
    ("max_pool2d", [2, 3], [], [0, 0]),
    ("avg_pool2d", [2, 2], [2, 2], [0, 0]),
    ("avg_pool2d", [3, 3], [2, 1], [1, 1]),
])
def test_pool(op: str, kernel: list[int], stride: list[int], padding: list[int]) -> None:
    x = torch.from_numpy(rand((2, 3, 9, 10), 26))
    want = getattr(F, op)(x, kernel, stride or kernel, padding)
    g = single(op, [("x", (2, 3, 9, 10), "float32")], tuple(want.shape), kernel=kernel, stride=stride, padding=padding)
    check(g, {"x": x.numpy()}, lambda _: want)


def test_spmm() -> None:
    rows, k, n = 7, 9, 4
    indptr = np.array([0, 3, 3, 5, 9, 10, 10, 12])  # rows 1 and 5 are empty, row 3 is the longest
    indices = np.array([0, 4, 8, 1, 2, 0, 3, 5, 7, 6, 2, 8])
    nnz = len(indices)
    specs = [("ip", (rows + 1,), "int64"), ("ix", (nnz,), "int64"), ("v", (nnz,), "float32"), ("d", (k, n), "float32")]
    g = single("spmm", specs, (rows, n), rows=rows)
    data = {"ip": indptr, "ix": indices, "v": rand((nnz,), 28), "d": rand((k, n), 29)}
    dense_a = np.zeros((rows, k))
    for r in range(rows):
        dense_a[r, indices[indptr[r]:indptr[r + 1]]] = data["v"][indptr[r]:indptr[r + 1]]
    check(g, data, lambda *_: torch.from_numpy(dense_a @ data["d"]))


def test_transpose() -> None:
    g = single("transpose", [("x", (2, 3, 4), "float32")], (4, 2, 3), perm=[2, 0, 1])
    check(g, {"x": rand((2, 3, 4), 30)}, lambda t: t.permute(2, 0, 1))


@pytest.mark.parametrize(("src", "dst"), [((2, 12), (2, 3, 4)), ((2, 3, 4), (6, 4)), ((6, 4), (4, 6)),
                                          ((3, 10), (5, 2, 3)), ((1, 5), (5,)), ((4,), (1, 4, 1))])
def test_reshape(src: tuple[int, ...], dst: tuple[int, ...]) -> None:
    g = single("reshape", [("x", src, "float32")], dst, shape=list(dst))
    check(g, {"x": rand(src, 31)}, lambda t: t.reshape(dst))


def test_expand() -> None:
    g = single("expand", [("x", (3, 1), "float32")], (2, 3, 4), shape=[2, 3, 4])
    check(g, {"x": rand((3, 1), 32)}, lambda t: t.expand(2, 3, 4))


def test_concat() -> None:
    specs = [("a", (2, 1, 3), "float32"), ("b", (2, 4, 3), "float32"), ("c", (2, 2, 3), "float32")]
    g = single("concat", specs, (2, 7, 3), axis=1)
    data = {n: rand(s, 33 + i) for i, (n, s, _) in enumerate(specs)}
    check(g, data, lambda *ts: torch.cat(ts, 1))


@pytest.mark.parametrize(("start", "end", "step", "size"), [(1, 7, 2, 3), (-5, 100, 1, 5), (0, 9, 4, 3)])
def test_slice(start: int, end: int, step: int, size: int) -> None:
    g = single("slice", [("x", (3, 9), "float32")], (3, size), axis=1, start=start, end=end, step=step)
    check(g, {"x": rand((3, 9), 36)}, lambda t: t[:, start:end:step])


def test_slice_negative_step_follows_python() -> None:
    x = rand((10,), 37)
    g = single("slice", [("x", (10,), "float32")], (4,), axis=0, start=8, end=1, step=-2)
    np.testing.assert_array_equal(evaluate(lower(g), {"x": x})["out"], x[8:1:-2])


@pytest.mark.parametrize(("ishape", "out"), [((4,), (3, 4, 2)), ((2, 2), (3, 2, 2, 2))])
def test_gather(ishape: tuple[int, ...], out: tuple[int, ...]) -> None:
    g = single("gather", [("x", (3, 5, 2), "float32"), ("i", ishape, "int64")], out, axis=1)
    idx = np.array([4, 0, 2, 2]).reshape(ishape)
    check(g, {"x": rand((3, 5, 2), 38), "i": idx},
          lambda x, i: torch.index_select(x, 1, i.reshape(-1)).reshape(out))


def test_chain_with_intermediates() -> None:
    b = GraphBuilder("mlp")
    x, w, bias = b.input("x", (4, 8), "float32"), b.param("w", (16, 8), "float32"), b.param("b", (16,), "float32")
    h = b.node("matmul", [x, w], (4, 16), "float32", transpose_b=True)
    h = b.node("add", [h, bias], (4, 16), "float32")
    out = b.node("gelu", [h], (4, 16), "float32", name="out")
    g = b.build([out, h])
    data = {"x": rand((4, 8), 40), "w": rand((16, 8), 41), "b": rand((16,), 42)}
    got = evaluate(lower(g), data)
    want = F.gelu(F.linear(*(torch.from_numpy(data[k]) for k in ("x", "w", "b"))))
    np.testing.assert_allclose(got["out"], want.numpy(), rtol=1e-12, atol=1e-12)
    assert set(got) == {"out", h}


def test_out_of_range_gather_index_is_an_error() -> None:
    g = single("gather", [("x", (3, 5), "float32"), ("i", (2,), "int64")], (3, 2), axis=1)
    with pytest.raises(EvaluationError, match="out of range"):
        evaluate(lower(g), {"x": rand((3, 5), 43), "i": np.array([1, 5])})
    with pytest.raises(EvaluationError, match="out of range"):
        evaluate(lower(g), {"x": rand((3, 5), 43), "i": np.array([-1, 0])})


def test_bad_inputs_are_errors() -> None:
    g = single("relu", [("x", (3, 5), "float32")], (3, 5))
    with pytest.raises(EvaluationError, match="missing input 'x'"):
        evaluate(lower(g), {})
    with pytest.raises(EvaluationError, match=r"shape \[5, 3\]"):
        evaluate(lower(g), {"x": np.zeros((5, 3))})


def test_bad_indptr_is_an_error() -> None:
    specs = [("ip", (3,), "int64"), ("ix", (2,), "int64"), ("v", (2,), "float32"), ("d", (4, 2), "float32")]
    g = single("spmm", specs, (2, 2), rows=2)
    data = {"ip": np.array([0, 2, 1]), "ix": np.array([0, 1]), "v": np.ones(2), "d": np.ones((4, 2))}
    with pytest.raises(EvaluationError, match="ragged"):
        evaluate(lower(g), data)


def test_a_large_layernorm_matches_torch() -> None:  # its speed is bench's business; the suite's timeout bounds it
    ln = single("layer_norm", [("x", (512, 4096), "float32"), ("w", (4096,), "float32"), ("b", (4096,), "float32")],
                (512, 4096), axes=[-1], eps=1e-5)
    data = {"x": rand((512, 4096), 44), "w": rand((4096,), 45), "b": rand((4096,), 46)}
    got = evaluate(lower(ln), data)["out"]
    want = F.layer_norm(torch.from_numpy(data["x"]), [4096], torch.from_numpy(data["w"]), torch.from_numpy(data["b"]))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)


# Sizes below the zoo's grids, so every family runs in about a second; others take their smallest grid point.
SMALL = {
    "llama_block": "h256-s64-b1", "lm_head": "h64-v1000-t32", "gpt_decoder": "h128-s64-b1",
    "bert_encoder": "h128-s64-b1", "vit_block": "h128-i64-b1", "gcn": "n256-f32-d0.02", "mixer_block": "h64-s49-b1",
    "convnext_block": "c32-i7-b1", "resnet_bottleneck": "c16-i14-b1", "resnet_basic": "c16-i7-b1",
    "resnet_stem": "i64-b1", "cnn_head": "c64-i7-b1",
}


def small_model(family: str) -> str:
    grid = FAMILIES.get(family).grid
    return f"{family}-{SMALL.get(family) or '-'.join(f'{k}{min(v)}' for k, v in grid.items())}"


@pytest.mark.parametrize("family", zoo.families())
def test_zoo_subgraphs_match_eager_in_float64(family: str) -> None:
    subgraphs = [s for s in partition(zoo.load(small_model(family))) if s.tunable]
    assert subgraphs
    for sub in subgraphs:
        inputs = random_inputs(sub.graph, seed=0)
        got = evaluate(lower(sub.graph), inputs)
        want = run_eager(sub.graph, {k: torch.from_numpy(np.asarray(v)) for k, v in inputs.items()},
                         compute_dtype=torch.float64)
        for name, tensor in want.items():
            expected = tensor.numpy()
            scale = float(np.abs(expected).max(initial=1.0))
            np.testing.assert_allclose(got[name], expected, rtol=1e-9, atol=1e-9 * scale,
                                       err_msg=f"{family}: {sub.ops} output {name}")


CHUNKED = [
    lambda: single("conv2d", [("x", (3, 4, 9, 9), "float32"), ("w", (6, 2, 3, 3), "float32")], (3, 6, 5, 5),
                   stride=[2, 2], padding=[1, 1], dilation=[1, 1], groups=2),
    lambda: single("matmul", [("a", (5, 6, 7), "float32"), ("b", (7, 3), "float32")], (5, 6, 3)),
    lambda: single("softmax", [("x", (9, 20), "float32")], (9, 20), axis=1),
    lambda: single("spmm", [("ip", (4,), "int64"), ("ix", (5,), "int64"), ("v", (5,), "float32"),
                            ("d", (6, 8), "float32")], (3, 8), rows=3),
    lambda: single("reshape", [("x", (4, 3, 5), "float32")], (4, 15), shape=[4, 15]),
]


@pytest.mark.parametrize("graph", CHUNKED)
def test_chunked_evaluation_matches_whole(graph, monkeypatch: pytest.MonkeyPatch) -> None:
    g = graph()
    inputs = random_inputs(g, seed=3)
    whole = evaluate(lower(g), inputs)["out"]
    monkeypatch.setattr("embed.evaluate._CHUNK", 16)
    np.testing.assert_array_equal(evaluate(lower(g), inputs)["out"], whole)


@needs_gpu
@pytest.mark.parametrize("family", zoo.families())
def test_zoo_subgraphs_evaluate_alike_with_cupy(family: str) -> None:
    import cupy

    for sub in (s for s in partition(zoo.load(small_model(family))) if s.tunable):
        inputs = random_inputs(sub.graph, seed=0)
        program = lower(sub.graph)
        want = evaluate(program, inputs)
        got = evaluate(program, {k: cupy.asarray(v) for k, v in inputs.items()}, xp=cupy)
        for name, expected in want.items():
            assert isinstance(got[name], cupy.ndarray) and got[name].dtype == expected.dtype
            scale = float(np.abs(expected).max(initial=1.0))
            np.testing.assert_allclose(got[name].get(), expected, rtol=1e-9, atol=1e-9 * scale,
                                       err_msg=f"{family}: {sub.ops} output {name}")


@needs_gpu
@pytest.mark.parametrize("op", UNARY)
def test_each_element_wise_op_evaluates_alike_with_cupy(op: str) -> None:
    import cupy

    g = single(op, [("x", (7, 129), "float32")], (7, 129))
    x = rand((7, 129), 1, positive=op in ("log", "sqrt", "rsqrt"))
    x[0, :5] = [-40.0, 40.0, -800.0, 800.0, 0.0] if op in ("sigmoid", "silu", "erf", "gelu", "tanh") else x[0, :5]
    want = evaluate(lower(g), {"x": x})["out"]
    got = evaluate(lower(g), {"x": cupy.asarray(x)}, xp=cupy)["out"]
    np.testing.assert_allclose(got.get(), want, rtol=1e-13, atol=1e-300)


@needs_gpu
@pytest.mark.parametrize("graph", CHUNKED)
def test_chunked_evaluation_with_cupy_matches_numpy(graph, monkeypatch: pytest.MonkeyPatch) -> None:
    import cupy

    g = graph()
    inputs = random_inputs(g, seed=3)
    whole = evaluate(lower(g), inputs)["out"]
    monkeypatch.setattr("embed.evaluate._CHUNK", 16)
    got = evaluate(lower(g), {k: cupy.asarray(v) for k, v in inputs.items()}, xp=cupy)["out"]
    np.testing.assert_allclose(got.get(), whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("a_index", "b_index", "want"), [
    # neither operand depends on the reduction dim r0 (extent 6): each term is summed 6 times
    ((P1, Affine(const=2)), (Affine(const=3), P0), lambda a, b: 6 * np.outer(a[:, 2], b[3, :])),
    # only a depends on it
    ((P1, R0), (Affine(const=3), P0), lambda a, b: np.outer(a.sum(axis=1), b[3, :])),
    # a depends on nothing but r0, b on nothing at all
    ((Affine(const=1), R0), (Affine(const=0), Affine(const=4)), lambda a, b: np.full((4, 5), a[1].sum() * b[0, 4])),
])
def test_a_sum_of_products_over_dims_its_operands_lack(a_index, b_index, want) -> None:
    # a matmul nest whose body is rewritten the way fusion can leave it: loads broadcast along the reduction
    b = GraphBuilder("mm")
    x, w = b.input("a", (4, 6), "float32"), b.input("b", (6, 5), "float32")
    program = lower(b.build([b.node("matmul", [x, w], (4, 5), "float32", name="out")]))
    (nest,) = program.nests
    body = Call("mul", (Load(Access("a", a_index)), Load(Access("b", b_index))))
    program = replace(program, nests=(replace(nest, statement=replace(nest.statement, body=body)),))
    data = {"a": rand((4, 6), 50), "b": rand((6, 5), 51)}
    np.testing.assert_allclose(evaluate(program, data)["out"], want(data["a"], data["b"]), rtol=1e-12)


@pytest.mark.parametrize(("op", "identity"), [("reduce_max", -np.inf), ("reduce_min", np.inf), ("reduce_sum", 0.0)])
def test_a_reduction_over_nothing_is_its_combiners_identity(op: str, identity: float) -> None:
    g = single(op, [("x", (3, 0), "float32")], (3,), axes=[1])
    np.testing.assert_array_equal(evaluate(lower(g), {"x": np.zeros((3, 0))})["out"], np.full(3, identity))


def test_a_padded_read_through_a_floor_division_gives_the_fill() -> None:
    # out[p] = sum over r < 6 of x[p, r // 2 - 1], reads left of x giving 0: (0 + 0) + 2 x[p, 0] + 2 x[p, 1]
    program = lower(single("reduce_sum", [("x", (4, 6), "float32")], (4,), axes=[1]))
    (nest,) = program.nests
    column = Affine.of(FloorDiv(Affine.of(nest.reduction[0].name), 2)) + (-1)
    body = Load(Access("x", (Affine.of(nest.parallel[0].name), column), 0.0))
    program = replace(program, nests=(replace(nest, statement=replace(nest.statement, body=body)),))
    x = rand((4, 6), 52)
    np.testing.assert_allclose(evaluate(program, {"x": x})["out"], 2 * x[:, 0] + 2 * x[:, 1], rtol=1e-12)


@pytest.mark.parametrize(("src", "dst"), [((4, 3, 5), (4, 15)), ((2, 3, 4, 5), (120,)), ((6, 8), (2, 3, 8))])
def test_a_reshape_reads_and_writes_through_views_not_gathers(src, dst, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_gather(*args, **kwargs):
        raise AssertionError("gathered")

    monkeypatch.setattr("embed.evaluate._NestEval.gather", no_gather)
    x = rand(src, 5)
    g = GraphBuilder("reshape_add")
    a, b = g.input("a", src, "float32"), g.input("b", dst, "float32")
    flat = g.node("reshape", [a], dst, "float32", shape=list(dst))
    graph = g.build([g.node("add", [flat, b], dst, "float32", name="out")])
    y = rand(dst, 6)
    np.testing.assert_array_equal(evaluate(lower(graph), {"a": x, "b": y})["out"], x.reshape(dst) + y)


def test_a_transposed_merge_is_no_view_and_reads_right() -> None:
    # out[k] = x[k % 5, k // 5]: the digits merge column-major, so no strided view of row-major x is this read
    program = lower(single("reshape", [("x", (5, 4), "float32")], (20,), shape=[20]))
    nest = program.nests[0]
    k = Affine.of(nest.dims[0].name)
    read = Load(Access("x", (Affine.of(Mod(k, 5)), Affine.of(FloorDiv(k, 5)))))
    program = replace(program, nests=(replace(nest, statement=replace(nest.statement, body=read)),))
    x = rand((5, 4), 7)
    np.testing.assert_array_equal(evaluate(program, {"x": x})["out"], x.T.reshape(-1))


def test_a_reshaped_read_past_its_tensor_is_an_error_not_a_view_beyond_it() -> None:
    program = lower(single("reshape", [("x", (4, 4), "float32")], (16,), shape=[16]))
    nest = program.nests[0]
    k = Affine.of(nest.dims[0].name)
    read = Load(Access("x", (Affine.of(FloorDiv(k, 4)) + 1, Affine.of(Mod(k, 4)))))  # rows 1..4 of a 4-row x
    program = replace(program, nests=(replace(nest, statement=replace(nest.statement, body=read)),))
    with pytest.raises(EvaluationError, match="out of range"):
        evaluate(program, {"x": rand((4, 4), 8)})
