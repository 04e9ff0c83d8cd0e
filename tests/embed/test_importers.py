"""ONNX and PyTorch importers: agreement between the two routes, non-zoo models, hostile files."""

import contextlib
import io
import os
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from embed import zoo
from embed.errors import EmbedError, ModelImportError
from embed.importers import import_module, load_model
from embed.importers.onnx_importer import import_onnx_bytes
from embed.ir import Graph, TensorRole
from embed.partition import partition

AGREE = ["gpt_decoder-h128-s16-b2", "llama_block-h128-s16-b1", "resnet_bottleneck-c16-i8-b2", "lm_head-h64-v500-t32"]


def _export(module: nn.Module, inputs: tuple, path: Path) -> Path:
    # optimize=False keeps weight transposes as nodes (the optimizer folds W.T into a new initializer);
    # opset 23 keeps RMSNormalization whole (older opsets decompose it into pow/mean/rsqrt).
    with contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(module, inputs, path, dynamo=True, external_data=False, optimize=False, opset_version=23)
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Graph, Path]]:
    """Zoo models built on cpu: their torch-route graph and an ONNX file exported from them."""
    folder = tmp_path_factory.mktemp("onnx")
    result = {}
    for name in AGREE:
        module, inputs = zoo.build(name, device="cpu")
        result[name] = (import_module(module, inputs, name=name), _export(module, inputs, folder / f"{name}.onnx"))
    return result


def _ops(graph: Graph) -> Counter[str]:
    return Counter(n.op for n in graph.nodes)


@pytest.mark.parametrize("name", AGREE)
def test_onnx_and_torch_routes_agree(exported: dict[str, tuple[Graph, Path]], name: str) -> None:
    via_torch, path = exported[name]
    via_onnx = load_model(str(path))
    assert _ops(via_onnx) == _ops(via_torch)
    hashes_torch = Counter(s.structural_hash for s in partition(via_torch) if s.tunable)
    hashes_onnx = Counter(s.structural_hash for s in partition(via_onnx) if s.tunable)
    assert hashes_onnx == hashes_torch and len(hashes_torch) >= 2
    params = {n: t.shape for n, t in via_onnx.tensors.items() if t.role == TensorRole.PARAM}
    assert params == {n: t.shape for n, t in via_torch.tensors.items() if t.role == TensorRole.PARAM}


def test_linear_maps_to_matmul_with_transposed_weight_and_bias(exported: dict[str, tuple[Graph, Path]]) -> None:
    via_torch, path = exported["gpt_decoder-h128-s16-b2"]
    for graph in (via_torch, load_model(str(path))):
        node = next(n for n in graph.nodes if n.op == "matmul" and n.inputs[1] == "attn.q.weight")
        assert node.attrs == {"transpose_b": True}
        add = next(n for n in graph.nodes if node.outputs[0] in n.inputs)
        assert add.op == "add" and add.inputs[1] == "attn.q.bias"
        assert graph.tensors["attn.q.weight"].shape == (128, 128)


class _Custom(nn.Module):
    """Not a zoo model: conv, max-pool, a 2-D linear, clamp, split, select and a scalar op."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.max_pool2d(torch.relu(self.conv(x)), 2).flatten(1)
        a, b = self.fc(y).clamp(-3.0, 3.0).split([4, 6], dim=1)
        return torch.softmax(b * 0.5, dim=-1)[:, 1:] + a[:, 0:1]


def test_onnx_file_of_a_custom_module_imports(tmp_path: Path) -> None:
    module, x = _Custom().eval(), torch.randn(2, 3, 8, 8)
    graph = load_model(str(_export(module, (x,), tmp_path / "custom.onnx")))
    ops = _ops(graph)
    for op in ("conv2d", "relu", "max_pool2d", "matmul", "maximum", "minimum", "softmax", "slice"):
        assert ops[op] >= 1, op
    assert graph.tensors[graph.outputs[0]].shape == (2, 5)
    assert _ops(import_module(module, (x,))) == ops
    pool = next(n for n in graph.nodes if n.op == "max_pool2d")
    assert pool.attrs == {"kernel": [2, 2], "stride": [2, 2], "padding": [0, 0]}
    scalar = next(t for t in graph.tensors.values() if t.role == TensorRole.CONST and t.value == (0.5,))
    assert scalar.shape == ()


# --- crafted ONNX models -------------------------------------------------------------------------------------------

def _model(nodes: list, inputs: list, outputs: list, initializers: list | None = None, value_info: list | None = None,
           opset: int = 18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers or [], value_info=value_info or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name: str, shape: list, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _relu_model() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2, 3])], [_vi("y", [2, 3])])


def _bytes(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString()


def test_crafted_gemm_model_maps_to_the_linear_pattern() -> None:
    w = numpy_helper.from_array(np.ones((5, 3), np.float32), "w")
    c = numpy_helper.from_array(np.ones(5, np.float32), "c")
    model = _model([helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1)], [_vi("x", [2, 3])],
                   [_vi("y", [2, 5])], [w, c])
    graph = import_onnx_bytes(_bytes(model))
    assert [(n.op, n.inputs[1:], n.attrs) for n in graph.nodes] == [
        ("matmul", ("w",), {"transpose_b": True}), ("add", ("c",), {})]
    assert graph.tensors["w"].role == TensorRole.PARAM and graph.tensors["c"].role == TensorRole.PARAM


def test_unknown_op_becomes_opaque_node() -> None:
    node = helper.make_node("Frobnicate", ["x"], ["z"], domain="com.example")
    model = _model([node, helper.make_node("Relu", ["z"], ["y"])], [_vi("x", [2, 3])], [_vi("y", [4])],
                   value_info=[_vi("z", [4])])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    graph = import_onnx_bytes(_bytes(model))
    assert [n.op for n in graph.nodes] == ["opaque", "relu"]
    assert graph.nodes[0].attrs == {"name": "com.example::Frobnicate"}
    assert graph.tensors[graph.nodes[0].outputs[0]].shape == (4,)


def test_dynamic_dims_need_values(tmp_path: Path) -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["batch", 3])], [_vi("y", ["batch", 3])])
    path = tmp_path / "dynamic.onnx"
    onnx.save(model, path)
    with pytest.raises(ModelImportError, match="static shapes.*batch"):
        load_model(str(path))
    assert load_model(str(path), dims={"batch": 7}).tensors["x"].shape == (7, 3)


def _external_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((3, 3), np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="../../etc/passwd")
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", [2, 3])], [_vi("y", [2, 3])], [w])


def _tensor(name: str, dims: list[int]) -> TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT)
    tensor.dims.extend(dims)
    return tensor


def _absurd_initializer() -> onnx.ModelProto:
    w = _tensor("w", [2**40, 3])
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", [2, 2**40])], [_vi("y", [2, 3])], [w])


def _negative_dims() -> onnx.ModelProto:
    w = _tensor("w", [-4, 3])
    return _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [2, 3])], [_vi("y", [2, 3])], [w])


def _dangling() -> onnx.ModelProto:
    return _model([helper.make_node("Add", ["x", "ghost"], ["y"])], [_vi("x", [2, 3])], [_vi("y", [2, 3])])


def _cycle() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Relu", ["a"], ["y"])]
    return _model(nodes, [_vi("x", [2, 3])], [_vi("y", [2, 3])])


def _huge_attribute() -> onnx.ModelProto:
    node = helper.make_node("Transpose", ["x"], ["y"], perm=list(range(100_000)))
    return _model([node], [_vi("x", [2, 3])], [_vi("y", [3, 2])])


def _absurd_input() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2**40, 2**40])], [_vi("y", [2**40, 2**40])])


def _old_opset() -> onnx.ModelProto:
    model = _relu_model()
    model.opset_import[0].version = 9
    return model


HOSTILE = {
    "random bytes": (lambda: os.urandom(4096), "not a valid ONNX|no graph outputs"),
    "truncated": (lambda: _bytes(_relu_model())[:-9], "not a valid ONNX|no graph outputs|never produced"),
    "external data": (lambda: _bytes(_external_model()), "outside the model.s folder"),
    "absurd initializer": (lambda: _bytes(_absurd_initializer()), "unsupported shape"),
    "negative dims": (lambda: _bytes(_negative_dims()), "unsupported shape"),
    "dangling reference": (lambda: _bytes(_dangling()), "'ghost', which nothing defines"),
    "cycle": (lambda: _bytes(_cycle()), "cycle"),
    "huge attribute": (lambda: _bytes(_huge_attribute()), "100000 entries|shape inference failed"),
    "absurd input": (lambda: _bytes(_absurd_input()), "unsupported shape"),
    "old opset": (lambda: _bytes(_old_opset()), "opset 9 is not supported"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_files_give_one_line_errors(case: str, tmp_path: Path) -> None:
    make, pattern = HOSTILE[case]
    path = tmp_path / "hostile.onnx"
    path.write_bytes(make())
    with pytest.raises(EmbedError, match=pattern) as info:
        load_model(str(path))
    assert "\n" not in str(info.value)


def test_oversized_file_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "big.onnx"
    path.write_bytes(_bytes(_relu_model()))
    with pytest.raises(ModelImportError, match="over the limit of 16 bytes"):
        load_model(str(path), max_bytes=16)
    assert [n.op for n in load_model(str(path)).nodes] == ["relu"]


def test_load_model_rejects_unknown_specs(tmp_path: Path) -> None:
    with pytest.raises(ModelImportError, match="expected a path to an .onnx or .json file, or zoo:NAME"):
        load_model("model.pt")
    with pytest.raises(ModelImportError, match="cannot read"):
        load_model(str(tmp_path / "missing.onnx"))
    with pytest.raises(ModelImportError, match="families: bert_encoder"):
        load_model("zoo:nonexistent")


# --- torch route ---------------------------------------------------------------------------------------------------

class _Mixed(nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        y = torch.cumsum(x, dim=-1) * 2.0 - 1.0
        att = nn.functional.scaled_dot_product_attention(y, y, y, attn_mask=mask)
        return att.masked_fill(att < 0, 0.5).to(torch.float64)


def test_torch_route_maps_scalars_sdpa_and_unknown_ops() -> None:
    graph = import_module(_Mixed(), (torch.randn(2, 4, 8), torch.zeros(4, 4)))
    ops = [n.op for n in graph.nodes]
    assert ops[0] == "opaque" and graph.nodes[0].attrs["name"] == "aten.cumsum.default"
    assert {"matmul", "softmax", "where", "cast"} <= set(ops)
    consts = sorted(t.value[0] for t in graph.tensors.values() if t.role == TensorRole.CONST)  # type: ignore[index]
    assert consts == sorted([2.0, 1.0, float(np.float32(8 ** -0.5)), 0.5])  # rounded to the tensor dtype
    assert graph.tensors[graph.outputs[0]].dtype == "float64"


def test_torch_route_reports_export_failures() -> None:
    class Bad(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x  # data-dependent control flow

    with pytest.raises(ModelImportError, match="torch.export failed for Bad"):
        import_module(Bad(), (torch.randn(3),))
