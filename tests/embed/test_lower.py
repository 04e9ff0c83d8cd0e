"""Structure of lowered programs: nests, roles, index forms, and the errors for bad graphs."""

import pytest

from embed.builder import GraphBuilder
from embed.errors import InvalidGraphError, UnsupportedSubgraphError
from embed.ir import Graph
from embed.loopnest import Affine, BufferKind, Combiner, DimKind, FloorDiv, Mod
from embed.lower import _RULES, lower
from embed.ops import OPS


def single(op: str, inputs, out_shape, out_dtype: str = "float32", **attrs) -> Graph:
    b = GraphBuilder(op)
    names = [b.input(n, s, d) for n, s, d in inputs]
    return b.build([b.node(op, names, out_shape, out_dtype, name="out", **attrs)])


def roles(nest) -> dict[str, tuple[int, DimKind]]:
    return {d.name: (d.extent, d.kind) for d in nest.dims}


def test_every_op_but_opaque_has_a_rule() -> None:
    assert set(_RULES) == set(OPS) - {"opaque"}


def test_row_softmax_is_three_nests_with_rows_parallel() -> None:
    program = lower(single("softmax", [("x", (64, 1000), "float32")], (64, 1000), axis=-1))
    mx, sm, norm = program.nests
    assert roles(mx) == {"p0": (64, DimKind.PARALLEL), "r0": (1000, DimKind.REDUCTION)}
    assert mx.statement.combiner == Combiner.MAX and sm.statement.combiner == Combiner.SUM
    assert roles(norm) == {"p0": (1000, DimKind.PARALLEL), "p1": (64, DimKind.PARALLEL)}
    assert mx.statement.loads()[0].stride("r0", (64, 1000)) == 1
    temps = [b for b in program.buffers.values() if b.kind == BufferKind.TEMP]
    assert [b.shape for b in temps] == [(64, 1), (64, 1)]


def test_column_reduction_has_a_strided_r0() -> None:
    (nest,) = lower(single("reduce_sum", [("x", (300, 40), "float32")], (40,), axes=[0])).nests
    assert roles(nest) == {"p0": (40, DimKind.PARALLEL), "r0": (300, DimKind.REDUCTION)}
    (load,) = nest.loads()
    assert load.stride("r0", (300, 40)) == 40 and load.stride("p0", (300, 40)) == 1


def test_matmul_roles_and_transpose_b() -> None:
    (nest,) = lower(single("matmul", [("a", (8, 32), "float32"), ("b", (32, 16), "float32")], (8, 16))).nests
    assert roles(nest) == {"p0": (16, DimKind.PARALLEL), "p1": (8, DimKind.PARALLEL), "r0": (32, DimKind.REDUCTION)}
    assert str(nest.statement.body) == "(a[p1, r0] * b[r0, p0])"
    (nest,) = lower(single("matmul", [("a", (8, 32), "float32"), ("b", (16, 32), "float32")], (8, 16),
                           transpose_b=True)).nests
    assert str(nest.statement.body) == "(a[p1, r0] * b[p0, r0])"


def test_conv2d_roles_and_padding() -> None:
    g = single("conv2d", [("x", (2, 4, 9, 9), "float32"), ("w", (6, 2, 3, 3), "float32")], (2, 6, 5, 5),
               stride=[2, 2], padding=[1, 1], dilation=[1, 1], groups=2)
    (nest,) = lower(g).nests
    assert [(d.name, d.extent) for d in nest.dims] == [
        ("p4", 2), ("p3", 2), ("p2", 3), ("p1", 5), ("p0", 5), ("r2", 2), ("r1", 3), ("r0", 3)
    ]
    x_load = nest.loads()[0]
    assert x_load.fill == 0.0
    assert str(x_load) == "x[p4, p3*2 + r2, p1*2 + r1 - 1, p0*2 + r0 - 1] (else 0.0)"
    assert str(nest.statement.write) == "out[p4, p3*3 + p2, p1, p0]"


def test_reshape_split_is_affine_and_merge_uses_div_mod() -> None:
    (split,) = lower(single("reshape", [("x", (4, 12), "float32")], (4, 3, 4), shape=[4, 3, 4])).nests
    assert str(split.statement.body) == "x[p2, p1*4 + p0]"
    (merge,) = lower(single("reshape", [("x", (4, 3, 4), "float32")], (4, 12), shape=[4, 12])).nests
    index = merge.loads()[0].index
    assert index[1] == Affine.of(FloorDiv(Affine.of("p0"), 4)) and index[2] == Affine.of(Mod(Affine.of("p0"), 4))


def test_spmm_is_a_ragged_reduction() -> None:
    specs = [("ip", (11,), "int64"), ("ix", (35,), "int64"), ("v", (35,), "float32"), ("d", (20, 8), "float32")]
    (nest,) = lower(single("spmm", specs, (10, 8), rows=10)).nests
    r0 = nest.dim("r0")
    assert r0 is not None and r0.extent == 4 and r0.ragged is not None
    assert str(r0.ragged.start) == "ip[p1]" and str(r0.ragged.stop) == "ip[p1 + 1]"
    assert str(nest.statement.body) == "(v[r0] * d[ix[r0], p0])"
    assert sorted(a.tensor for a in nest.loads()) == ["d", "ip", "ip", "ix", "v"]


def test_size_one_axes_get_no_dims() -> None:
    (nest,) = lower(single("matmul", [("a", (7, 1), "float32"), ("b", (1, 9), "float32")], (7, 9))).nests
    assert nest.reduction == () and nest.statement.combiner is None
    program = lower(single("reduce_mean", [("x", (5, 1), "float32")], (5,), axes=[1]))
    assert str(program.nests[0].statement.body) == "(x[p0, 0] / 1.0)"


def test_concat_writes_each_input_at_its_offset() -> None:
    g = single("concat", [("a", (2, 3), "float32"), ("b", (2, 5), "float32")], (2, 8), axis=1)
    first, second = lower(g).nests
    assert str(first.statement.write) == "out[p1, p0]" and str(second.statement.write) == "out[p1, p0 + 3]"


def test_scalar_constants_are_inlined() -> None:
    b = GraphBuilder("c")
    x = b.input("x", (4,), "float32")
    out = b.node("mul", [x, b.const(0.5, "float32")], (4,), "float32", name="out")
    program = lower(b.build([out]))
    assert str(program.nests[0].statement.body) == "(x[p0] * 0.5)"
    assert set(program.buffers) == {"x", "out"}


def test_program_str_is_pseudo_code() -> None:
    text = str(lower(single("layer_norm", [("x", (4, 8), "float32")], (4, 8), axes=[-1], eps=1e-5)))
    assert "input x: float32[4, 8]" in text and "output out: float32[4, 8]" in text
    assert "acc += x[p0, r0]" in text and "out_mean[p0, 0] = (acc / 8.0)" in text


def test_opaque_is_unsupported() -> None:
    b = GraphBuilder("o")
    x = b.input("x", (4,), "float32")
    (y,) = b.opaque("my_op", [x], [((4,), "float32")])
    with pytest.raises(UnsupportedSubgraphError, match=r"node 0 \(opaque\)"):
        lower(b.build([y]))


@pytest.mark.parametrize(("graph", "message"), [
    (lambda: single("add", [("a", (3, 4), "float32"), ("b", (4,), "float32")], (3, 5)), "output out has shape"),
    (lambda: single("add", [("a", (3, 4), "float32"), ("b", (3,), "float32")], (3, 4)), "do not broadcast"),
    (lambda: single("matmul", [("a", (3, 4), "float32"), ("b", (5, 6), "float32")], (3, 6)), "inner dims differ"),
    (lambda: single("layer_norm", [("x", (3, 4, 5), "float32")], (3, 4, 5), axes=[1], eps=1e-5), "trailing"),
    (lambda: single("cast", [("x", (3,), "float32")], (3,), "float16", dtype="int64"), "casts to int64"),
    (lambda: single("cast", [("x", (3,), "float32")], (3,), "float16", dtype="complex"), "unknown dtype"),
    (lambda: single("gelu", [("x", (3,), "float32")], (3,), approximate="fast"), "approximate"),
    (lambda: single("softmax", [("x", (3, 4), "float32")], (3, 4), axis=2), "axis 2 out of range"),
    (lambda: single("transpose", [("x", (3, 4), "float32")], (4, 3), perm=[1, 1]), "not a permutation"),
    (lambda: single("reshape", [("x", (3, 4), "float32")], (5, 2), shape=[5, 2]), "cannot reshape"),
    (lambda: single("conv2d", [("x", (1, 3, 8, 8), "float32"), ("w", (4, 2, 3, 3), "float32")], (1, 4, 6, 6),
                    stride=[1], padding=[0], dilation=[1], groups=1), "channels"),
    (lambda: single("max_pool2d", [("x", (1, 3, 2, 2), "float32")], (1, 3, 1, 1), kernel=[3, 3], stride=[1, 1],
                    padding=[0, 0]), "window larger"),
    (lambda: single("nll_loss", [("p", (4, 3), "float32"), ("t", (4,), "float32")], (), reduction="mean"),
     "integer"),
    (lambda: single("gather", [("x", (4, 3), "float32"), ("i", (2,), "int64")], (4, 2), axis=0), "output out"),
    (lambda: single("concat", [("a", (2, 3), "float32"), ("b", (3, 3), "float32")], (2, 6), axis=1), "differ"),
    (lambda: single("slice", [("x", (4,), "float32")], (2,), axis=0, start=0, end=4, step=0), "step"),
    (lambda: single("spmm", [("ip", (4,), "int64"), ("ix", (5,), "int64"), ("v", (5,), "float32"),
                             ("d", (6, 2), "float32")], (2, 2), rows=2), "indptr"),
])
def test_bad_graphs_raise_invalid_graph_error(graph, message: str) -> None:
    with pytest.raises(InvalidGraphError, match=message):
        lower(graph())
