from collections import Counter

import pytest
import torch

from embed.builder import GraphBuilder
from embed.eager import run_eager
from embed.inputs import random_inputs
from embed.ir import Graph, TensorRole
from embed.partition import partition
from embed.subgraph import Subgraph, SubgraphKind

F32 = "float32"
K = SubgraphKind


def summary(subgraphs: list[Subgraph]) -> list[tuple[str, list[str]]]:
    return [(s.kind.value, s.ops) for s in subgraphs]


def recomposed(graph: Graph, subgraphs: list[Subgraph], seed: int = 0) -> None:
    """Running the subgraphs one after another, in the order given, computes what the whole graph does."""
    inputs = {k: torch.from_numpy(v) for k, v in random_inputs(graph, seed=seed).items()}
    expected = run_eager(graph, inputs)
    values = dict(inputs)
    for s in subgraphs:
        out = run_eager(s.graph, {c: values[o] for c, o in zip(s.graph.inputs, s.source_inputs, strict=True)})
        values.update({o: out[c] for c, o in zip(s.graph.outputs, s.source_outputs, strict=True)})
    for name, value in expected.items():
        torch.testing.assert_close(values[name], value)
    assert sorted(n for s in subgraphs for n in s.ops) == sorted(n.op for n in graph.nodes)


def linear_gelu(prefix: str = "", rows: int = 8) -> Graph:
    g = GraphBuilder(prefix + "mlp")
    x = g.input(prefix + "x", (rows, 16), F32)
    m = g.node("matmul", [x, g.param(prefix + "w", (16, 32), F32)], (rows, 32), F32)
    a = g.node("add", [m, g.param(prefix + "b", (32,), F32)], (rows, 32), F32)
    return g.build([g.node("gelu", [a], (rows, 32), F32)])


def test_matmul_bias_gelu_is_one_contraction() -> None:
    graph = linear_gelu()
    (sub,) = partition(graph)
    assert (sub.kind, sub.ops) == (K.CONTRACTION, ["matmul", "add", "gelu"])
    assert sub.source_inputs == ("x", "w", "b") and sub.source_outputs == (graph.outputs[0],)
    roles = [sub.graph.tensors[t].role for t in sub.graph.inputs]
    assert roles == [TensorRole.INPUT, TensorRole.PARAM, TensorRole.PARAM]
    recomposed(graph, [sub])


def test_add_layer_norm_is_one_reduction_and_keeps_the_sum_as_output() -> None:
    g = GraphBuilder("prenorm")
    x, y = g.input("x", (4, 16), F32), g.input("y", (4, 16), F32)
    h = g.node("add", [x, y], (4, 16), F32, name="h")
    n = g.node("layer_norm", [h, g.param("gamma", (16,), F32)], (4, 16), F32, axes=[-1], eps=1e-5)
    m = g.node("matmul", [n, g.param("w", (16, 16), F32)], (4, 16), F32)
    graph = g.build([g.node("add", [m, h], (4, 16), F32)])
    subs = partition(graph)
    assert summary(subs) == [("reduction", ["add", "layer_norm"]), ("contraction", ["matmul", "add"])]
    assert set(subs[0].source_outputs) == {"h", n}
    recomposed(graph, subs)


def test_opaque_node_splits_a_pointwise_chain() -> None:
    g = GraphBuilder("chain")
    t = g.input("x", (4, 4), F32)
    t = g.node("exp", [g.node("relu", [t], (4, 4), F32)], (4, 4), F32)
    (t,) = g.opaque("aten::frobnicate", [t], [((4, 4), F32)])
    graph = g.build([g.node("sigmoid", [g.node("neg", [t], (4, 4), F32)], (4, 4), F32)])
    subs = partition(graph)
    assert summary(subs) == [("pointwise", ["relu", "exp"]), ("opaque", ["opaque"]), ("pointwise", ["neg", "sigmoid"])]
    assert [s.tunable for s in subs] == [True, False, True]
    assert "aten::frobnicate" in (subs[1].not_tunable_reason or "")


def test_isomorphic_blocks_in_different_graphs_hash_alike() -> None:
    alone = partition(linear_gelu())
    g = GraphBuilder("bigger")
    x = g.input("input", (8, 16), F32)
    pre = g.node("transpose", [g.node("transpose", [x], (16, 8), F32, perm=[1, 0])], (8, 16), F32, perm=[1, 0])
    m = g.node("matmul", [pre, g.param("W", (16, 32), F32)], (8, 32), F32)
    a = g.node("add", [m, g.param("B", (32,), F32)], (8, 32), F32)
    out = g.node("transpose", [g.node("gelu", [a], (8, 32), F32)], (32, 8), F32, perm=[1, 0])
    subs = partition(g.build([out]))
    assert summary(subs) == [("layout", ["transpose", "transpose"]), ("contraction", ["matmul", "add", "gelu"]),
                             ("layout", ["transpose"])]
    assert subs[1].structural_hash == alone[0].structural_hash
    assert subs[1].graph == alone[0].graph.model_copy(update={"name": subs[1].graph.name})
    other_size = partition(linear_gelu(rows=4))[0]
    assert other_size.structural_hash != alone[0].structural_hash
    assert other_size.family_hash == alone[0].family_hash


def attention(batch: int = 2, seq: int = 8, dim: int = 16) -> Graph:
    g = GraphBuilder("attention")
    q, k, v = (g.input(n, (batch, seq, dim), F32) for n in "qkv")
    mask = g.input("mask", (batch, 1, seq), F32)
    s = g.node("matmul", [q, k], (batch, seq, seq), F32, transpose_b=True)
    s = g.node("mul", [s, g.const(0.25, F32)], (batch, seq, seq), F32)
    s = g.node("add", [s, mask], (batch, seq, seq), F32)
    p = g.node("softmax", [s], (batch, seq, seq), F32, axis=-1)
    o = g.node("matmul", [p, v], (batch, seq, dim), F32)
    o = g.node("reshape", [o], (batch * seq, dim), F32, shape=[batch * seq, dim])
    return g.build([g.node("transpose", [o], (dim, batch * seq), F32, perm=[1, 0])])


def test_softmax_takes_scale_and_mask_and_views_fuse_as_epilogue() -> None:
    graph = attention()
    subs = partition(graph)
    assert summary(subs) == [
        ("contraction", ["matmul"]),
        ("reduction", ["mul", "add", "softmax"]),
        ("contraction", ["matmul", "reshape"]),
        ("layout", ["transpose"]),
    ]
    assert [graph.tensors[n].role for n in subs[1].source_inputs] == [TensorRole.INTERMEDIATE, TensorRole.INPUT]
    recomposed(graph, subs)


def test_cross_entropy_and_decomposed_norms_are_single_reductions() -> None:
    g = GraphBuilder("heads")
    logits = g.input("logits", (6, 10), F32)
    target = g.input("target", (6,), "int64")
    logp = g.node("log_softmax", [logits], (6, 10), F32, axis=1)
    loss = g.node("nll_loss", [logp, target], (), F32, reduction="mean")
    # layer norm by hand: mean, centre, variance, normalise
    x = g.input("x", (4, 12), F32)
    mean = g.node("reduce_mean", [x], (4, 1), F32, axes=[-1], keepdim=True)
    d = g.node("sub", [x, mean], (4, 12), F32)
    var = g.node("reduce_mean", [g.node("mul", [d, d], (4, 12), F32)], (4, 1), F32, axes=[1], keepdim=True)
    std = g.node("sqrt", [g.node("add", [var, g.const(1e-5, F32)], (4, 1), F32)], (4, 1), F32)
    y = g.node("div", [d, std], (4, 12), F32)
    # a sum over another axis stays apart
    col = g.node("reduce_sum", [y], (12,), F32, axes=[0])
    graph = g.build([loss, col])
    subs = partition(graph)
    assert summary(subs) == [
        ("reduction", ["log_softmax", "nll_loss"]),
        ("reduction", ["reduce_mean", "sub", "mul", "reduce_mean", "add", "sqrt", "div"]),
        ("reduction", ["reduce_sum"]),
    ]
    recomposed(graph, subs)


def test_conv_batchnorm_relu_residual_and_pool() -> None:
    g = GraphBuilder("resblock")
    x = g.input("x", (2, 4, 8, 8), F32)
    c = g.node("conv2d", [x, g.param("w", (4, 4, 3, 3), F32)], (2, 4, 8, 8), F32,
               stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1)
    stats = [g.param(n, (4,), F32) for n in ("mean", "var", "gamma", "beta")]
    bn = g.node("batch_norm", [c, *stats], (2, 4, 8, 8), F32, eps=1e-5)
    r = g.node("relu", [g.node("add", [bn, x], (2, 4, 8, 8), F32)], (2, 4, 8, 8), F32)
    p = g.node("max_pool2d", [r], (2, 4, 4, 4), F32, kernel=[2, 2], stride=[2, 2], padding=[0, 0])
    graph = g.build([p])
    subs = partition(graph)
    assert summary(subs) == [("convolution", ["conv2d", "batch_norm", "add", "relu"]), ("convolution", ["max_pool2d"])]
    recomposed(graph, subs)


def test_gcn_layer_spmm_with_epilogue() -> None:
    g = GraphBuilder("gcn")
    indptr, indices = g.input("indptr", (7,), "int64"), g.input("indices", (14,), "int64")
    values, x = g.input("values", (14,), F32), g.input("x", (5, 8), F32)
    xw = g.node("matmul", [x, g.param("w", (8, 4), F32)], (5, 4), F32)
    ax = g.node("spmm", [indptr, indices, values, xw], (6, 4), F32, rows=6)
    out = g.node("relu", [g.node("add", [ax, g.param("b", (4,), F32)], (6, 4), F32)], (6, 4), F32)
    graph = g.build([out])
    subs = partition(graph)
    assert summary(subs) == [("contraction", ["matmul"]), ("sparse", ["spmm", "add", "relu"])]
    recomposed(graph, subs)


def test_layout_chain_gather_concat_slice() -> None:
    g = GraphBuilder("layout")
    table, ids = g.param("table", (10, 6), F32), g.input("ids", (4,), "int64")
    rows = g.node("gather", [table, ids], (4, 6), F32, axis=0)
    both = g.node("concat", [rows, g.input("extra", (2, 6), F32)], (6, 6), F32, axis=0)
    half = g.node("slice", [both], (3, 6), F32, axis=0, start=0, end=6, step=2)
    flat = g.node("reshape", [half], (18,), F32, shape=[18])
    graph = g.build([g.node("exp", [flat], (18,), F32)])
    subs = partition(graph)
    assert summary(subs) == [("layout", ["gather", "concat", "slice", "reshape"]), ("pointwise", ["exp"])]
    recomposed(graph, subs)


def test_epilogue_that_would_close_a_cycle_goes_elsewhere() -> None:
    g = GraphBuilder("diamond")
    x = g.input("x", (4, 4), F32)
    m = g.node("matmul", [x, g.param("w1", (4, 4), F32)], (4, 4), F32)
    r = g.node("relu", [m], (4, 4), F32)
    m2 = g.node("matmul", [m, g.param("w2", (4, 4), F32)], (4, 4), F32)
    graph = g.build([g.node("add", [r, m2], (4, 4), F32)])
    subs = partition(graph)
    # add cannot join the first matmul's group: that group would feed the second matmul and read it back.
    assert summary(subs) == [("contraction", ["matmul", "relu"]), ("contraction", ["matmul", "add"])]
    assert set(subs[0].source_outputs) == {m, r}
    recomposed(graph, subs)


def test_pointwise_chain_with_broadcast_and_lone_view() -> None:
    g = GraphBuilder("pw")
    x, s = g.input("x", (3, 5), F32), g.input("s", (5,), F32)
    e = g.node("expand", [s], (3, 5), F32, shape=[3, 5])
    y = g.node("tanh", [g.node("mul", [x, e], (3, 5), F32)], (3, 5), F32)
    z = g.node("add", [y, g.node("neg", [x], (3, 5), F32)], (3, 5), F32)
    v = g.node("reshape", [g.input("u", (15,), F32)], (3, 5), F32, shape=[3, 5])
    graph = g.build([z, v])
    subs = partition(graph)
    assert summary(subs) == [("pointwise", ["expand", "mul", "tanh", "neg", "add"]), ("layout", ["reshape"])]
    recomposed(graph, subs)


TINY = [
    "bert_encoder-h128-s32-b1", "cnn_head-c64-i7-b1", "convnext_block-c16-i7-b1", "gcn-n256-f32-d0.02",
    "gpt_decoder-h128-s32-b1", "llama_block-h256-s32-b1", "lm_head-h64-v1000-t64", "mixer_block-h64-s16-b1",
    "resnet_basic-c16-i7-b1", "resnet_bottleneck-c16-i14-b1", "resnet_stem-i32-b1", "vit_block-h128-i32-b1",
]


@pytest.fixture(scope="module")
def zoo_graphs() -> dict[str, Graph]:
    """Every zoo family at a small size: off the grid where listed here, else its smallest grid member."""
    zoo = pytest.importorskip("embed.zoo")
    from embed.zoo.family import FAMILIES

    names = {f: f + "".join(f"-{k}{min(v)}" for k, v in FAMILIES.get(f).grid.items()) for f in zoo.families()}
    names.update((n.partition("-")[0], n) for n in TINY if n.partition("-")[0] in names)
    return {name: zoo.load(name) for name in names.values()}


def test_every_zoo_family_partitions_in_executable_order(zoo_graphs: dict[str, Graph]) -> None:
    kinds: Counter[SubgraphKind] = Counter()
    for name, graph in zoo_graphs.items():
        subs = partition(graph)
        assert sorted(op for s in subs for op in s.ops) == sorted(n.op for n in graph.nodes), name
        available = set(graph.inputs) | {t for t, v in graph.tensors.items() if v.role == TensorRole.CONST}
        for s in subs:
            assert set(s.source_inputs) <= available, name
            available |= set(s.source_outputs)
        assert set(graph.outputs) <= available, name
        kinds.update(s.kind for s in subs)
    assert {K.CONTRACTION, K.REDUCTION, K.CONVOLUTION, K.SPARSE, K.LAYOUT} <= set(kinds)


def test_zoo_subgraphs_run_eagerly_and_recompose(zoo_graphs: dict[str, Graph]) -> None:
    """Every distinct subgraph runs alone on random inputs, and all of them together compute the model."""
    seen: set[str] = set()
    for graph in zoo_graphs.values():
        subs = partition(graph)
        for s in subs:
            if s.tunable and s.structural_hash not in seen:
                seen.add(s.structural_hash)
                arrays = random_inputs(s.graph, seed=1)
                outputs = run_eager(s.graph, {k: torch.from_numpy(v) for k, v in arrays.items()})
                for name, value in outputs.items():
                    assert tuple(value.shape) == s.graph.tensors[name].shape
                    assert torch.isfinite(value.float()).all(), (graph.name, s.ops)
        recomposed(graph, subs)
    assert len(seen) > 30
