"""External data: accepted inside the model's own folder with the declared sizes, refused in one line otherwise."""

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from embed.errors import ModelImportError
from embed.importers import load_model
from embed.importers.onnx_importer import import_onnx_bytes
from embed.ir import TensorRole


def _model(folder: Path, location: str = "m.onnx.data", *, offset: int = 0, length: int | None = None) -> Path:
    """x[2,64] @ w[64,64] + shift[64] (int64, small: read for folding); w and shift live in m.onnx.data."""
    w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    shape = np.array([2, 64], np.int64)
    (folder / "m.onnx.data").write_bytes(w.tobytes() + shape.tobytes())
    tensors = []
    for name, array, at in (("w", w, 0), ("shape", shape, w.nbytes)):
        tensor = numpy_helper.from_array(array, name)
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
        declared = array.nbytes if length is None else length
        for key, value in (("location", location), ("offset", str(at + offset)), ("length", str(declared))):
            tensor.external_data.add(key=key, value=value)
        tensors.append(tensor)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Reshape", ["h", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])], tensors)
    path = folder / "m.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


def test_external_data_beside_the_model_imports(tmp_path: Path) -> None:
    graph = load_model(str(_model(tmp_path)))
    assert graph.tensors["w"].role == TensorRole.PARAM and graph.tensors["w"].shape == (64, 64)
    assert [n.op for n in graph.nodes] == ["matmul"]  # the reshape to [2, 64] was folded from the read shape


def test_external_data_in_a_subfolder_imports(tmp_path: Path) -> None:
    (tmp_path / "weights").mkdir()
    path = _model(tmp_path, "weights/m.onnx.data")
    os.replace(tmp_path / "m.onnx.data", tmp_path / "weights" / "m.onnx.data")
    assert load_model(str(path)).tensors["w"].shape == (64, 64)


def _symlink_out(tmp: Path) -> Path:
    (tmp / "model").mkdir()
    path = _model(tmp / "model")
    os.replace(tmp / "model" / "m.onnx.data", tmp / "outside.data")
    (tmp / "model" / "m.onnx.data").symlink_to(tmp / "outside.data")
    return path


def _fifo(tmp: Path) -> Path:
    path = _model(tmp, "pipe")
    os.mkfifo(tmp / "pipe")
    return path


TRICKS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "dot-dot": (lambda t: _model(t, "../m.onnx.data"), "outside the model's folder"),
    "absolute": (lambda t: _model(t, str(t / "m.onnx.data")), "outside the model's folder"),
    "etc passwd": (lambda t: _model(t, "/etc/passwd"), "outside the model's folder"),
    "windows drive": (lambda t: _model(t, "C:\\data.bin"), "outside the model's folder"),
    "backslash dot-dot": (lambda t: _model(t, "..\\m.onnx.data"), "outside the model's folder"),
    "symlink out": (_symlink_out, "resolves outside the model's folder"),
    "missing file": (lambda t: _model(t, "nothere.data"), "cannot be read"),
    "folder": (lambda t: _model(t, "."), "not a regular file"),
    "fifo": (_fifo, "not a regular file"),
    "short length": (lambda t: _model(t, length=12), "needs"),
    "past the end": (lambda t: _model(t, offset=10**6), "which has"),
    "negative offset": (lambda t: _model(t, offset=-10**6), "offset"),
    "empty location": (lambda t: _model(t, ""), "no usable external data location"),
}


@pytest.mark.parametrize("case", sorted(TRICKS))
def test_external_data_tricks_are_refused_in_one_line(tmp_path: Path, case: str) -> None:
    make, message = TRICKS[case]
    with pytest.raises(ModelImportError, match=message) as info:
        load_model(str(make(tmp_path)))
    assert "\n" not in str(info.value)


def test_external_data_needs_a_folder_when_imported_from_bytes(tmp_path: Path) -> None:
    data = _model(tmp_path).read_bytes()
    with pytest.raises(ModelImportError, match="needs the model's folder"):
        import_onnx_bytes(data)
    assert import_onnx_bytes(data, folder=tmp_path).tensors["w"].shape == (64, 64)


def test_external_constant_attribute_is_read_when_small(tmp_path: Path) -> None:
    (tmp_path / "c.bin").write_bytes(np.array([3, 4], np.int64).tobytes())
    value = TensorProto(name="v", data_type=TensorProto.INT64, dims=[2], data_location=TensorProto.EXTERNAL)
    value.external_data.add(key="location", value="c.bin")
    nodes = [helper.make_node("Constant", [], ["s"], value=value), helper.make_node("Reshape", ["x", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])])
    path = tmp_path / "c.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    graph = load_model(str(path))
    assert graph.tensors[graph.outputs[0]].shape == (3, 4)
