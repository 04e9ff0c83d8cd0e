"""Limits the importer enforces before it allocates: computed (not declared) shapes before folding, axes and perms
refused out of range, sequences refused, and linear work in the number of names and nodes."""

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from embed.builder import GraphBuilder
from embed.errors import ModelImportError
from embed.importers.lowering import Lowering
from embed.importers.onnx_importer import import_onnx_bytes
from embed.importers.onnx_node import OnnxNode
from embed.partition import _Partitioner


def _vi(name: str, shape: list[int] | None, elem: int = TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _bytes(nodes, inputs, outputs, inits=(), value_info=()) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits), value_info=list(value_info))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _ints(name: str, values) -> TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


@pytest.fixture
def folds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The op types the importer folded (evaluated on values) during the test."""
    seen: list[str] = []
    fold = OnnxNode.fold

    def recording(self: OnnxNode):
        seen.append(self.node.op_type)
        return fold(self)

    monkeypatch.setattr(OnnxNode, "fold", recording)
    return seen


BOMBS = {
    "ConstantOfShape": ([helper.make_node("ConstantOfShape", ["s"], ["y"])], [], [_ints("s", [1 << 16, 1 << 12])]),
    "Expand": ([helper.make_node("Expand", ["x", "s"], ["y"])], [], [_ints("x", [1]), _ints("s", [1 << 16, 1 << 12])]),
    "Tile": ([helper.make_node("Tile", ["x", "s"], ["y"])], [], [_ints("x", [[1]]), _ints("s", [1 << 16, 1 << 12])]),
    "Range": (
        [helper.make_node("Range", ["a", "b", "c"], ["y"])],
        [],
        [_ints("a", 0), _ints("b", 1 << 28), _ints("c", 1)],
    ),
}


@pytest.mark.parametrize("op", sorted(BOMBS))
def test_a_small_declared_shape_does_not_get_a_huge_op_folded(op: str, folds: list[str]) -> None:
    nodes, inputs, inits = BOMBS[op]
    outputs = [_vi("y", [1], TensorProto.FLOAT if op == "ConstantOfShape" else TensorProto.INT64)]
    data = _bytes(nodes, [*inputs], outputs, inits, value_info=outputs)  # the file says [1]; the truth is 2^28
    try:
        graph = import_onnx_bytes(data)
    except ModelImportError as exc:
        assert "\n" not in str(exc)
    else:
        assert graph.tensors[graph.outputs[0]].shape != (1,)
    assert op not in folds


def test_small_growing_ops_still_fold(folds: list[str]) -> None:
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["shape"]), helper.make_node("Reshape", ["x", "t"], ["y"])]
    data = _bytes(nodes, [_vi("x", [4, 6])], [_vi("y", [24])], [_ints("s", [1]), _ints("t", [24])])
    assert import_onnx_bytes(data).tensors is not None
    assert "ConstantOfShape" in folds


OUT_OF_RANGE = {
    "softmax axis": (helper.make_node("Softmax", ["x"], ["y"], axis=2), [], "axis 2 is out of range for rank 2"),
    "transpose perm": (helper.make_node("Transpose", ["x"], ["y"], perm=[5, 0]), [], "perm entry 5 is out of range"),
    "repeated perm": (helper.make_node("Transpose", ["x"], ["y"], perm=[0, 0]), [], "not a permutation"),
    "gather index": (
        helper.make_node("Gather", ["x", "i"], ["y"], axis=1),
        [numpy_helper.from_array(np.array(8, np.int64), "i")],
        "index 8 is out of range",
    ),
    "reduce axes": (helper.make_node("ReduceSum", ["x", "a"], ["y"]), [_ints("a", [-3])], "axis -3 is out of range"),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_out_of_range_axes_and_indices_are_refused_not_wrapped(case: str) -> None:
    node, inits, message = OUT_OF_RANGE[case]
    with pytest.raises(ModelImportError, match=message):
        import_onnx_bytes(_bytes([node], [_vi("x", [4, 8])], [_vi("y", None)], inits))


def test_split_to_sequence_bomb_is_refused_before_making_nodes() -> None:
    nodes = [
        helper.make_node("SplitToSequence", ["x"], ["s"], axis=0),
        helper.make_node("SequenceAt", ["s", "i"], ["y"]),
    ]
    data = _bytes(nodes, [_vi("x", [10**6])], [_vi("y", [1])], [numpy_helper.from_array(np.array(0, np.int64), "i")])
    with pytest.raises(ModelImportError, match="1000000 parts, over the limit of 1024"):
        import_onnx_bytes(data)


def test_a_sequence_typed_graph_output_is_refused() -> None:
    out = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [1, 4])
    data = _bytes([helper.make_node("SplitToSequence", ["x"], ["s"], axis=0)], [_vi("x", [4, 4])], [out])
    with pytest.raises(ModelImportError, match="graph output 's' is a sequence"):
        import_onnx_bytes(data)


class _CountingDict(dict):
    lookups = 0

    def __contains__(self, key: object) -> bool:
        type(self).lookups += 1
        return super().__contains__(key)


def test_fresh_names_sharing_a_long_prefix_cost_linear_lookups() -> None:
    lw = Lowering("g")
    lw.builder.tensors = _CountingDict()
    prefix = "p" * 300  # longer than the 250 characters a name keeps: every name collides with the first
    for i in range(2000):
        lw.builder.input(lw.fresh_name(f"{prefix}{i}"), (2,), "float32")
    assert len(lw.builder.tensors) == 2000
    assert _CountingDict.lookups < 10 * 2000  # quadratic: about 2000^2 / 2


class _CountingList(list):
    reads = 0

    def __getitem__(self, i):  # type: ignore[override]
        type(self).reads += 1
        return super().__getitem__(i)


def test_partitioning_a_long_chain_costs_linear_work(tmp_path: Path) -> None:
    b = GraphBuilder("chain")
    x = b.input("x", (4, 4), "float32")
    for i in range(3000):
        x = b.node(("relu", "neg", "sigmoid")[i % 3], [x], (4, 4), "float32")
    state = _Partitioner(b.build([x]))
    state.successors = _CountingList(state.successors)
    state.claim_prologues()
    state.fuse()
    assert len(state.groups) == 1
    assert _CountingList.reads < 20 * 3000  # quadratic: about 3000^2 / 2
