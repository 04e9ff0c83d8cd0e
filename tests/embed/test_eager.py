import math

import numpy as np
import pytest
import torch

from embed.builder import GraphBuilder
from embed.eager import EagerProgram, run_eager
from embed.errors import EmbedError, InvalidGraphError, UnsupportedSubgraphError
from embed.inputs import random_inputs
from tests.gpu import needs_gpu

F32 = "float32"


def one_op(op: str, inputs: list[tuple[str, tuple, str]], out: tuple[int, ...], out_dtype: str = F32, **attrs):
    """A graph of one op reading the named inputs."""
    g = GraphBuilder(op)
    names = [g.input(name, shape, dt) for name, shape, dt in inputs]
    return g.build([g.node(op, names, out, out_dtype, **attrs)])


def run(graph, **arrays: np.ndarray) -> np.ndarray:
    (result,) = run_eager(graph, {k: torch.from_numpy(v) for k, v in arrays.items()}).values()
    return result.numpy()


rng = np.random.default_rng(0)
A = rng.standard_normal((2, 3, 4)).astype(np.float32)


@pytest.mark.parametrize(
    ("op", "reference"),
    [
        ("exp", np.exp), ("neg", np.negative), ("tanh", np.tanh), ("abs", np.abs), ("sin", np.sin),
        ("relu", lambda x: np.maximum(x, 0)), ("sigmoid", lambda x: 1 / (1 + np.exp(-x))),
        ("silu", lambda x: x / (1 + np.exp(-x))), ("erf", np.vectorize(math.erf)),
        ("gelu", lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))),
    ],
)
def test_unary_ops(op, reference) -> None:
    graph = one_op(op, [("x", A.shape, F32)], A.shape)
    np.testing.assert_allclose(run(graph, x=A), reference(A.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_positive_domain_ops_and_gelu_tanh() -> None:
    x = np.abs(A) + 0.5
    refs = [("sqrt", np.sqrt), ("rsqrt", lambda v: 1 / np.sqrt(v)), ("log", np.log), ("reciprocal", np.reciprocal)]
    for op, ref in refs:
        np.testing.assert_allclose(run(one_op(op, [("x", A.shape, F32)], A.shape), x=x), ref(x), rtol=1e-5)
    tanh_gelu = 0.5 * A * (1 + np.tanh(math.sqrt(2 / math.pi) * (A + 0.044715 * A**3)))
    graph = one_op("gelu", [("x", A.shape, F32)], A.shape, approximate="tanh")
    np.testing.assert_allclose(run(graph, x=A), tanh_gelu, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("op", "reference"),
    [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("div", np.divide),
     ("maximum", np.maximum), ("minimum", np.minimum), ("pow", np.power)],
)
def test_binary_ops_broadcast(op, reference) -> None:
    a, b = np.abs(A) + 0.1, rng.uniform(0.5, 2, (3, 1)).astype(np.float32)
    graph = one_op(op, [("a", A.shape, F32), ("b", (3, 1), F32)], A.shape)
    np.testing.assert_allclose(run(graph, a=a, b=b), reference(a, b), rtol=1e-5)


def test_where_cast_identity() -> None:
    cond = A > 0
    graph = one_op("where", [("c", A.shape, "bool"), ("a", A.shape, F32), ("b", (4,), F32)], A.shape)
    b = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(run(graph, c=cond, a=A, b=b), np.where(cond, A, b))
    cast = run(one_op("cast", [("x", A.shape, F32)], A.shape, "int64", dtype="int64"), x=A * 10)
    assert cast.dtype == np.int64
    np.testing.assert_array_equal(cast, (A * 10).astype(np.int64))
    np.testing.assert_array_equal(run(one_op("identity", [("x", A.shape, F32)], A.shape), x=A), A)


def test_batch_norm_inference() -> None:
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    mean, var, w, b = (rng.uniform(0.5, 2, 3).astype(np.float32) for _ in range(4))
    graph = one_op("batch_norm", [(n, s, F32) for n, s in [("x", x.shape), ("m", (3,)), ("v", (3,)), ("w", (3,)),
                                                            ("b", (3,))]], x.shape, eps=1e-3)
    c = (slice(None), None, None)
    expected = (x - mean[c]) / np.sqrt(var[c] + 1e-3) * w[c] + b[c]
    np.testing.assert_allclose(run(graph, x=x, m=mean, v=var, w=w, b=b), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("op", "reference"),
    [("reduce_sum", np.sum), ("reduce_mean", np.mean), ("reduce_max", np.max), ("reduce_min", np.min)],
)
def test_reductions(op, reference) -> None:
    graph = one_op(op, [("x", A.shape, F32)], (2, 1, 1), axes=[1, -1], keepdim=True)
    np.testing.assert_allclose(run(graph, x=A), reference(A, axis=(1, 2), keepdims=True), rtol=1e-5)
    graph = one_op(op, [("x", A.shape, F32)], (3,), axes=[0, 2])
    np.testing.assert_allclose(run(graph, x=A), reference(A, axis=(0, 2)), rtol=1e-5)


def test_softmax_and_log_softmax() -> None:
    e = np.exp(A - A.max(axis=1, keepdims=True))
    softmax = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(run(one_op("softmax", [("x", A.shape, F32)], A.shape, axis=1), x=A), softmax, rtol=1e-5)
    log = run(one_op("log_softmax", [("x", A.shape, F32)], A.shape, axis=-2), x=A)
    np.testing.assert_allclose(log, np.log(softmax), rtol=1e-5, atol=1e-6)


def test_layer_norm_and_rms_norm_over_trailing_axes() -> None:
    w, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    mean, var = A.mean(axis=(1, 2), keepdims=True), A.var(axis=(1, 2), keepdims=True)
    graph = one_op("layer_norm", [("x", A.shape, F32), ("w", (3, 4), F32), ("b", (3, 4), F32)], A.shape,
                   axes=[1, 2], eps=1e-5)
    np.testing.assert_allclose(run(graph, x=A, w=w, b=b), (A - mean) / np.sqrt(var + 1e-5) * w + b, atol=1e-5)
    bare = one_op("layer_norm", [("x", A.shape, F32)], A.shape, axes=[-1], eps=1e-5)
    m1, v1 = A.mean(axis=-1, keepdims=True), A.var(axis=-1, keepdims=True)
    np.testing.assert_allclose(run(bare, x=A), (A - m1) / np.sqrt(v1 + 1e-5), atol=1e-5)
    rms = one_op("rms_norm", [("x", A.shape, F32), ("w", (4,), F32)], A.shape, axes=[-1], eps=1e-6)
    expected = A / np.sqrt((A**2).mean(axis=-1, keepdims=True) + 1e-6) * w[0]
    np.testing.assert_allclose(run(rms, x=A, w=w[0]), expected, rtol=1e-5)
    with pytest.raises(UnsupportedSubgraphError, match="not trailing"):
        run(one_op("layer_norm", [("x", A.shape, F32)], A.shape, axes=[0], eps=1e-5), x=A)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss(reduction: str) -> None:
    logp, target = rng.standard_normal((5, 7)).astype(np.float32), np.array([0, 6, 3, 3, 1])
    picked = -logp[np.arange(5), target]
    expected = {"mean": picked.mean(), "sum": picked.sum(), "none": picked}[reduction]
    graph = one_op("nll_loss", [("p", (5, 7), F32), ("t", (5,), "int64")], np.shape(expected), reduction=reduction)
    np.testing.assert_allclose(run(graph, p=logp, t=target), expected, rtol=1e-5)


def test_matmul_batched_broadcast_and_transposed() -> None:
    a, b = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    graph = one_op("matmul", [("a", a.shape, F32), ("b", b.shape, F32)], (2, 3, 5), transpose_b=True)
    np.testing.assert_allclose(run(graph, a=a, b=b), a @ b.T, rtol=1e-5, atol=1e-6)
    graph = one_op("matmul", [("a", a.shape, F32), ("b", (4, 5), F32)], (2, 3, 5))
    np.testing.assert_allclose(run(graph, a=a, b=b.T.copy()), a @ b.T, rtol=1e-5, atol=1e-6)


def _direct_conv(x, w, stride, pad, dilation):
    x = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[2]), (pad[1], pad[3])))
    n, _, h, wd = x.shape
    co, ci, kh, kw = w.shape
    oh, ow = (h - dilation * (kh - 1) - 1) // stride + 1, (wd - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, co, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, :, i * stride: i * stride + dilation * (kh - 1) + 1: dilation,
                      j * stride: j * stride + dilation * (kw - 1) + 1: dilation]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return out


@pytest.mark.parametrize("padding", [[1, 1], [1, 0, 0, 2]])
def test_conv2d(padding: list[int]) -> None:
    x, w = rng.standard_normal((2, 3, 7, 6)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    pad4 = padding * 2 if len(padding) == 2 else padding
    expected = _direct_conv(x, w, 2, pad4, 1) + bias[:, None, None]
    graph = one_op("conv2d", [("x", x.shape, F32), ("w", w.shape, F32), ("b", (4,), F32)], expected.shape,
                   stride=[2, 2], padding=padding, dilation=[1, 1], groups=1)
    np.testing.assert_allclose(run(graph, x=x, w=w, b=bias), expected, rtol=1e-4, atol=1e-5)


def test_pools() -> None:
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    blocks = x.reshape(1, 2, 2, 2, 2, 2)
    graph = one_op("max_pool2d", [("x", x.shape, F32)], (1, 2, 2, 2), kernel=[2, 2], stride=[2, 2], padding=[0, 0])
    np.testing.assert_allclose(run(graph, x=x), blocks.max(axis=(3, 5)))
    graph = one_op("avg_pool2d", [("x", x.shape, F32)], (1, 2, 2, 2), kernel=[2, 2], stride=[2, 2], padding=[0, 0])
    np.testing.assert_allclose(run(graph, x=x), blocks.mean(axis=(3, 5)), rtol=1e-6)


def test_spmm_on_csr() -> None:
    dense_a = np.array([[0, 2, 0, 1], [0, 0, 0, 0], [3, 0, 0, 4]], dtype=np.float32)
    indptr, indices = np.array([0, 2, 2, 4]), np.array([1, 3, 0, 3])
    values = np.array([2, 1, 3, 4], dtype=np.float32)
    dense = rng.standard_normal((4, 5)).astype(np.float32)
    graph = one_op("spmm", [("p", (4,), "int64"), ("i", (4,), "int64"), ("v", (4,), F32), ("d", (4, 5), F32)],
                   (3, 5), rows=3)
    np.testing.assert_allclose(run(graph, p=indptr, i=indices, v=values, d=dense), dense_a @ dense, rtol=1e-6)


def test_layout_ops() -> None:
    transpose = one_op("transpose", [("x", A.shape, F32)], (4, 2, 3), perm=[2, 0, 1])
    np.testing.assert_array_equal(run(transpose, x=A), A.transpose(2, 0, 1))
    reshape = one_op("reshape", [("x", A.shape, F32)], (6, 4), shape=[-1, 4])
    np.testing.assert_array_equal(run(reshape, x=A), A.reshape(6, 4))
    expand = one_op("expand", [("x", (3, 1), F32)], (2, 3, 4), shape=[2, 3, 4])
    np.testing.assert_array_equal(run(expand, x=A[0, :, :1].copy()), np.broadcast_to(A[0, :, :1], (2, 3, 4)))
    concat = one_op("concat", [("x", A.shape, F32), ("y", (2, 1, 4), F32)], (2, 4, 4), axis=1)
    np.testing.assert_array_equal(run(concat, x=A, y=A[:, :1].copy()), np.concatenate([A, A[:, :1]], axis=1))
    sliced = one_op("slice", [("x", A.shape, F32)], (2, 3, 2), axis=-1, start=1, end=100, step=2)
    np.testing.assert_array_equal(run(sliced, x=A), A[:, :, 1::2])
    gather = one_op("gather", [("x", A.shape, F32), ("i", (5,), "int64")], (2, 5, 4), axis=1)
    index = np.array([2, 0, 0, 1, 2])
    np.testing.assert_array_equal(run(gather, x=A, i=index), A[:, index])


def test_constants_chain_and_compute_dtype() -> None:
    g = GraphBuilder()
    x = g.input("x", (3,), "float16")
    y = g.node("mul", [x, g.const([1.0, 2.0, 3.0], "float16", (3,))], (3,), "float16")
    graph = g.build([g.node("add", [y, g.const(0.1, "float16")], (3,), "float16")])
    inputs = {"x": torch.tensor([1.0, 1.0, 1.0], dtype=torch.float16)}
    (half,) = run_eager(graph, inputs).values()
    (wide,) = run_eager(graph, inputs, compute_dtype=torch.float64).values()
    assert half.dtype == torch.float16 and wide.dtype == torch.float64
    np.testing.assert_allclose(wide.numpy(), [1.1, 2.1, 3.1], rtol=1e-12)


def relu6_then_scaled() -> tuple:
    """relu6 (maximum with 0, minimum with 6) of x, then times a (3,) constant and concatenated with a () one."""
    g = GraphBuilder()
    x = g.input("x", (3,), "float32")
    low, high, scale, lone = (g.const(0.0, "float32"), g.const(6.0, "float32"),
                              g.const([1.0, 2.0, 3.0], "float32", (3,)), g.const(7.0, "float32"))
    y = g.node("minimum", [g.node("maximum", [x, low], (3,), "float32"), high], (3,), "float32")
    y = g.node("mul", [y, scale], (3,), "float32")
    flat = g.node("reshape", [lone], (1,), "float32", shape=[1])
    return g.build([g.node("concat", [y, flat], (4,), "float32", axis=0)]), (low, high), (scale, lone)


def test_scalar_constants_of_binary_ops_stay_cpu_scalars_and_no_other() -> None:
    graph, scalars, others = relu6_then_scaled()
    program = EagerProgram(graph, "meta")  # every other constant goes to the program's device
    assert all(program.consts[n].device.type == "cpu" and program.consts[n].dim() == 0 for n in scalars)
    assert all(program.consts[n].device.type == "meta" for n in others)


def test_run_eager_makes_constants_where_its_inputs_are_but_scalars_of_binary_ops_on_the_cpu(monkeypatch) -> None:
    from embed import eager

    graph, _, _ = relu6_then_scaled()
    seen = []
    for op in ("maximum", "minimum"):
        monkeypatch.setitem(eager._KERNELS, op, lambda args, attrs, shape, kernel=eager._KERNELS[op]: seen.append(
            args[1].device.type) or kernel(args, attrs, shape))
    (out,) = run_eager(graph, {"x": torch.empty(3, device="meta")}).values()  # the (3,) constant made there too
    # relu6's bounds as cpu scalars: a GPU eager timing runs the vectorized kernel (a one-element GPU tensor is a
    # broadcast operand, in the strided kernel: mobilenet's conv + batch-norm + relu6 timed at 2.5x)
    assert out.device.type == "meta" and seen == ["cpu", "cpu"]


@needs_gpu
def test_cpu_scalar_constants_compute_on_the_gpu() -> None:
    graph, _, _ = relu6_then_scaled()
    (out,) = EagerProgram(graph, "cuda")({"x": torch.tensor([-1.0, 3.0, 9.0], device="cuda")}).values()
    assert out.device.type == "cuda" and out.tolist() == [0.0, 6.0, 18.0, 7.0]


def test_errors_are_typed() -> None:
    g = GraphBuilder()
    x = g.input("x", (3,), F32)
    (y,) = g.opaque("my_custom_op", [x], [((3,), F32)])
    with pytest.raises(UnsupportedSubgraphError, match="my_custom_op"):
        run_eager(g.build([y]), {"x": torch.zeros(3)})
    graph = one_op("relu", [("x", (3,), F32)], (3,))
    with pytest.raises(EmbedError, match="missing inputs"):
        run_eager(graph, {})
    with pytest.raises(EmbedError, match="shape"):
        run_eager(graph, {"x": torch.zeros(4)})
    wrong = one_op("matmul", [("a", (2, 3), F32), ("b", (3, 4), F32)], (2, 5))
    with pytest.raises(InvalidGraphError, match="declared"):
        run_eager(wrong, {"a": torch.zeros(2, 3), "b": torch.zeros(3, 4)})
    bad = one_op("matmul", [("a", (2, 3), F32), ("b", (5, 4), F32)], (2, 4))
    with pytest.raises(EmbedError, match="node 0 \\(matmul\\) failed"):
        run_eager(bad, {"a": torch.zeros(2, 3), "b": torch.zeros(5, 4)})


def _reader_graph() -> GraphBuilder:
    g = GraphBuilder("readers")
    table, ids = g.param("table", (10, 3), F32), g.input("ids", (6,), "int64")
    rows = g.node("gather", [table, ids], (6, 3), F32, axis=0)
    logp, target = g.input("logp", (6, 5), F32), g.input("target", (6,), "int32")
    loss = g.node("nll_loss", [logp, g.node("cast", [target], (6,), "int64", dtype="int64")], (), F32, reduction="sum")
    v = g.input("v", (6, 3), "float16")
    root = g.node("rsqrt", [g.node("add", [v, g.const(1e-5, "float16")], (6, 3), "float16")], (6, 3), "float16")
    indptr, indices = g.input("indptr", (9,), "int64"), g.input("indices", (20,), "int64")
    dense = g.input("dense", (7, 4), "bfloat16")
    prod = g.node("spmm", [indptr, indices, g.input("values", (20,), "bfloat16"), dense], (8, 4), "bfloat16", rows=8)
    w = g.param("w", (3, 400), F32)
    proj = g.node("matmul", [rows, w], (6, 400), F32)
    flag = g.input("flag", (6, 3), "bool")
    picked = g.node("where", [flag, rows, g.node("cast", [root], (6, 3), F32, dtype="float32")], (6, 3), F32)
    g.nodes_out = [loss, prod, proj, picked]  # type: ignore[attr-defined]
    return g


def test_random_inputs_respect_what_reads_them() -> None:
    g = _reader_graph()
    graph = g.build(g.nodes_out)  # type: ignore[attr-defined]
    arrays = random_inputs(graph, seed=3)
    assert set(arrays) == set(graph.inputs)
    for name, array in arrays.items():
        assert array.shape == graph.tensors[name].shape
        if array.dtype.kind == "f":
            assert np.all(array != 0) and np.all(np.isfinite(array))
    assert arrays["ids"].min() >= 0 and arrays["ids"].max() < 10 and len(np.unique(arrays["ids"])) > 1
    assert arrays["target"].dtype == np.int32 and arrays["target"].min() >= 0 and arrays["target"].max() < 5
    assert arrays["v"].dtype == np.float16 and arrays["v"].min() >= 0.5
    assert arrays["flag"].dtype == np.bool_ and 0 < arrays["flag"].sum() < 18
    indptr, indices = arrays["indptr"], arrays["indices"]
    assert indptr[0] == 0 and indptr[-1] == 20 and np.all(np.diff(indptr) >= 0)
    assert indices.min() >= 0 and indices.max() < 7
    for r in range(8):
        row = indices[indptr[r]:indptr[r + 1]]
        assert np.all(np.diff(row) > 0)  # sorted, distinct
    bf16 = arrays["dense"]
    assert bf16.dtype == np.float32 and np.all(bf16.view(np.uint32) & 0xFFFF == 0)
    assert 0.5 < arrays["w"].std() < 0.65  # 1/sqrt(fan-in), the fan-in being the 3 rows of w
    outputs = run_eager(graph, {k: torch.from_numpy(v) for k, v in arrays.items()})
    assert all(torch.isfinite(v.float()).all() for v in outputs.values())


def test_random_inputs_are_deterministic_per_seed() -> None:
    g = _reader_graph()
    graph = g.build(g.nodes_out)  # type: ignore[attr-defined]
    first, again, other = (random_inputs(graph, seed=s) for s in (1, 1, 2))
    for name in graph.inputs:
        np.testing.assert_array_equal(first[name], again[name])
    assert any(not np.array_equal(first[n], other[n]) for n in graph.inputs)


def test_dense_csr_and_scalar_inputs() -> None:
    g = GraphBuilder()
    full = g.node("spmm", [g.input("p", (4,), "int64"), g.input("i", (12,), "int64"), g.input("v", (12,), F32),
                           g.input("d", (4, 2), F32)], (3, 2), F32, rows=3)
    scalar = g.node("log", [g.input("s", (), F32)], (), F32)
    arrays = random_inputs(g.build([full, scalar]), seed=0)
    np.testing.assert_array_equal(arrays["p"], [0, 4, 8, 12])
    np.testing.assert_array_equal(arrays["i"], [0, 1, 2, 3] * 3)
    assert arrays["s"].shape == () and arrays["s"] >= 0.5
    g = GraphBuilder()
    g.node("spmm", [g.input("p", (3,), "int64"), g.input("i", (5,), "int64"), g.input("v", (5,), F32),
                    g.input("d", (2, 2), F32)], (2, 2), F32, rows=2)
    with pytest.raises(EmbedError, match="do not fit"):
        random_inputs(g.build([g.nodes[-1].outputs[0]]), seed=0)
