"""ONNX importer: a ``.onnx`` file (opset 13+) -> ``Graph``.

The file is read with a size limit and parsed. External data (``torch.onnx.export``'s default) is accepted
when every location names a regular file inside the model's own folder and holds the declared bytes; only
the small tensors that constant folding needs are read from it. Shapes
come from ``onnx.shape_inference`` (strict mode off, data propagation on); every tensor the IR
keeps needs a static shape. Models with symbolic dimensions import when ``dims`` gives each
symbol a value (``{"batch": 4, "seq": 128}``), the documented fallback for dynamic exports.

Initializers become PARAM tensors (values are not kept), except scalars and small integer
tensors, which are constants. Constant sub-expressions over small values (``Shape``,
``Concat`` of shape pieces, ``Constant``...) are folded. Ops are mapped by ``onnx_ops``; any other op
becomes an ``opaque`` node.
"""

import heapq
import math
import os
import stat
from collections.abc import Mapping
from os import PathLike
from pathlib import Path, PurePosixPath, PureWindowsPath

import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, numpy_helper, shape_inference

from embed.errors import EmbedError, ModelImportError
from embed.importers.files import read_limited
from embed.importers.lowering import Lowering, one_line
from embed.importers.onnx_node import GROWING, OnnxNode, Value
from embed.importers.onnx_ops import CONVERTERS, FOLDABLE
from embed.ir import MAX_DIM, MAX_ELEMENTS, MAX_NODES, MAX_RANK, DType, Graph

DEFAULT_MAX_BYTES = 512 * 2**20
MIN_OPSET = 13
FOLD_LIMIT = 4096  # values up to this many elements are kept for constant folding

ELEM_TYPES = {
    TensorProto.FLOAT: DType.FLOAT32, TensorProto.DOUBLE: DType.FLOAT64, TensorProto.FLOAT16: DType.FLOAT16,
    TensorProto.BFLOAT16: DType.BFLOAT16, TensorProto.INT64: DType.INT64, TensorProto.INT32: DType.INT32,
    TensorProto.BOOL: DType.BOOL,
}
_DATA_FIELDS = ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")
_ITEMSIZE = {TensorProto.FLOAT: 4, TensorProto.DOUBLE: 8, TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2,
             TensorProto.INT64: 8, TensorProto.INT32: 4, TensorProto.BOOL: 1, TensorProto.INT8: 1,
             TensorProto.UINT8: 1, TensorProto.INT16: 2, TensorProto.UINT16: 2, TensorProto.UINT32: 4,
             TensorProto.UINT64: 8}


def import_onnx(path: str | PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES,
                dims: Mapping[str, int] | None = None) -> Graph:
    """Import the ONNX file at ``path``; raises ``ModelImportError``/``InvalidGraphError`` with one line."""
    file = Path(path)
    data = read_limited(file, max_bytes)
    return import_onnx_bytes(data, name=file.stem, dims=dims, folder=file.parent)


def import_onnx_bytes(data: bytes, *, name: str = "", dims: Mapping[str, int] | None = None,
                      folder: str | PathLike[str] | None = None) -> Graph:
    """Import a serialized ONNX ``ModelProto``; external data is looked up in ``folder`` (refused without one)."""
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError, RecursionError) as exc:
        raise ModelImportError(f"not a valid ONNX file (truncated or corrupt): {one_line(exc)}") from None
    _check_model(model, None if folder is None else Path(folder))
    return _Importer(model, name or model.graph.name, dict(dims or {})).run()


def _external(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data) > 0


def _location(entries: dict[str, str], folder: Path, what: str) -> Path:
    """The file an external tensor's ``location`` names, refused unless it is a regular file inside ``folder``."""
    location = entries.get("location", "")
    if not location or "\0" in location or len(location) > 1024:
        raise ModelImportError(f"{what} has no usable external data location")
    parts = PurePosixPath(location.replace("\\", "/")).parts
    if PurePosixPath(location).is_absolute() or PureWindowsPath(location).is_absolute() or PureWindowsPath(
            location).drive or ".." in parts:
        raise ModelImportError(f"{what} has external data at {location[:80]!r}, outside the model's folder; "
                               "external data must be a file beside the model (no absolute paths, no '..')")
    root = os.path.realpath(folder)
    target = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, target]) != root:
        raise ModelImportError(f"{what} has external data at {location[:80]!r}, which resolves outside the model's "
                               "folder (a symbolic link?)")
    try:
        info = os.stat(target)
    except OSError as exc:
        raise ModelImportError(f"{what} has external data at {location[:80]!r}, which cannot be read: "
                               f"{exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ModelImportError(f"{what} has external data at {location[:80]!r}, which is not a regular file")
    return Path(target)


def _resolve_external(tensor: TensorProto, folder: Path | None, what: str) -> None:
    """Check ``tensor``'s external data against its declared size; read it in when it is small enough to fold
    (the rest is never read: the IR keeps weights' shapes, not their values)."""
    if folder is None:
        raise ModelImportError(f"{what} uses external data, which needs the model's folder: import it from a path")
    entries = {e.key: e.value for e in tensor.external_data}
    path = _location(entries, folder, what)
    itemsize = _ITEMSIZE.get(tensor.data_type)
    if itemsize is None:
        raise ModelImportError(f"{what} has external data of element type {tensor.data_type}, which is not supported")
    shape = _dims(list(tensor.dims), what)
    expected = math.prod(shape) * itemsize
    try:
        offset = int(entries.get("offset", "0"))
        length = int(entries.get("length", str(expected)))
    except ValueError:
        raise ModelImportError(f"{what} has a non-integer external data offset or length") from None
    if offset < 0 or length != expected:
        raise ModelImportError(f"{what} declares {length} bytes of external data at offset {offset}; its shape "
                               f"{list(shape)} needs {expected}")
    size = path.stat().st_size
    if offset + length > size:
        raise ModelImportError(f"{what} needs bytes {offset}..{offset + length} of {path.name}, which has {size}")
    raw = b""
    if math.prod(shape) <= FOLD_LIMIT:
        with path.open("rb") as f:
            f.seek(offset)
            raw = f.read(length)
    del tensor.external_data[:]
    tensor.data_location = TensorProto.DEFAULT
    tensor.raw_data = raw


def _check_graph(graph: onnx.GraphProto, folder: Path | None, depth: int = 0) -> None:
    if depth > 8:
        raise ModelImportError("subgraphs are nested more than 8 deep")
    for init in graph.initializer:
        if _external(init):
            _resolve_external(init, folder, f"initializer {init.name[:80]!r}")
    for node in graph.node:
        for attr in node.attribute:
            tensors = [attr.t] if attr.HasField("t") else list(attr.tensors)
            for tensor in tensors:
                if _external(tensor):
                    _resolve_external(tensor, folder, f"node {node.name[:80]!r}")
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                _check_graph(sub, folder, depth + 1)


def _check_model(model: onnx.ModelProto, folder: Path | None) -> None:
    graph = model.graph
    if not model.HasField("graph") or not graph.output:
        raise ModelImportError("not an ONNX model: it has no graph outputs")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset < MIN_OPSET:
        raise ModelImportError(
            f"ONNX opset {opset} is not supported; convert the model to opset {MIN_OPSET}+ "
            "(onnx.version_converter.convert_version)")
    if len(graph.node) > MAX_NODES:
        raise ModelImportError(f"the model has {len(graph.node)} nodes, over the limit of {MAX_NODES}")
    _check_graph(graph, folder)


def _dims(dims: list[int], what: str) -> tuple[int, ...]:
    if len(dims) > MAX_RANK or any(d < 0 or d > MAX_DIM for d in dims) or math.prod(dims) > MAX_ELEMENTS:
        raise ModelImportError(f"{what} has an unsupported shape {list(dims)[:MAX_RANK + 1]} "
                               f"(rank <= {MAX_RANK}, dims 0..{MAX_DIM}, <= {MAX_ELEMENTS} elements)")
    return tuple(dims)


class _Importer:
    def __init__(self, model: onnx.ModelProto, name: str, dims: dict[str, int]) -> None:
        self.model, self.graph, self.dims = model, model.graph, dims
        self.lw = Lowering(name)
        self.values: dict[str, Value] = {}  # source name -> IR tensor name or a static array
        self.types: dict[str, tuple[tuple[int, ...] | None, int]] = {}

    def run(self) -> Graph:
        params = self._read_initializers()
        self._infer_types()
        for inp in self.graph.input:
            if inp.name not in params and inp.name not in self.values:
                shape, dtype = self.type_of(inp.name, f"graph input {inp.name[:80]!r}")
                self.values[inp.name] = self.lw.builder.input(self.lw.fresh_name(inp.name), shape, dtype)
        for i, node in enumerate(_toposort(self.graph, set(self.values) | params)):
            try:
                self._convert(node)
            except EmbedError as exc:
                raise type(exc)(f"node {i} ({node.op_type} {node.name[:80]!r}): {exc}") from None
            except Exception as exc:  # hostile files reach corners of the converters; report, never a traceback
                raise ModelImportError(f"node {i} ({node.op_type} {node.name[:80]!r}): {one_line(exc)}") from None
        for out in self.graph.output:
            if isinstance(self.values.get(out.name), list) or self.types.get(out.name, (None, 0))[1] == -1:
                raise ModelImportError(f"graph output {out.name[:80]!r} is a sequence, which the IR does not support")
        outputs = [OnnxNode.materialize(self, out.name) for out in self.graph.output]
        return self.lw.build(list(dict.fromkeys(outputs)))

    def _read_initializers(self) -> set[str]:
        """Small initializers become static values, the others PARAM tensors; their data is then dropped."""
        params: set[str] = set()
        for init in self.graph.initializer:
            what = f"initializer {init.name[:80]!r}"
            shape = _dims(list(init.dims), what)
            dtype = ELEM_TYPES.get(init.data_type)
            if math.prod(shape) <= FOLD_LIMIT and (not shape or dtype is None or not dtype.is_float):
                try:
                    self.values[init.name] = numpy_helper.to_array(init).reshape(shape)
                except Exception as exc:
                    raise ModelImportError(f"{what} has unreadable data: {one_line(exc)}") from None
            else:
                self.values[init.name] = self.lw.builder.param(self.lw.fresh_name(init.name), shape,
                                                               self.dtype_of(init.data_type, what))
                params.add(init.name)
            for field in _DATA_FIELDS:
                init.ClearField(field)
        for sparse in self.graph.sparse_initializer:
            what = f"sparse initializer {sparse.values.name[:80]!r}"
            dtype = self.dtype_of(sparse.values.data_type, what)
            shape = _dims(list(sparse.dims), what)
            self.values[sparse.values.name] = self.lw.builder.param(self.lw.fresh_name(sparse.values.name), shape,
                                                                    dtype)
            params.add(sparse.values.name)
        return params

    def _infer_types(self) -> None:
        """Shapes computed by ONNX shape inference with the file's declarations (``value_info``, output shapes)
        taken out first, so a lying declaration cannot shrink a huge tensor; a declaration is used only where
        inference knows nothing (the outputs of ops outside ONNX, for one)."""
        for inp in self.graph.input:
            for dim in inp.type.tensor_type.shape.dim:
                if dim.HasField("dim_param") and dim.dim_param in self.dims:
                    dim.dim_value = int(self.dims[dim.dim_param])
        declared = {info.name: (self._shape_of(info), info.type.tensor_type.elem_type)
                    for info in [*self.graph.value_info, *self.graph.output]}
        stripped = onnx.ModelProto()
        stripped.CopyFrom(self.model)
        del stripped.graph.value_info[:]
        for out in stripped.graph.output:
            if out.type.HasField("tensor_type"):
                out.type.tensor_type.ClearField("shape")
        try:
            inferred = shape_inference.infer_shapes(stripped, check_type=False, strict_mode=False, data_prop=True)
        except Exception as exc:
            raise ModelImportError(f"ONNX shape inference failed: {one_line(exc)}") from None
        g = inferred.graph
        for info in [*g.input, *g.value_info, *g.output]:
            if info.type.HasField("sequence_type") or info.type.HasField("optional_type"):
                self.types[info.name] = (None, -1)
                continue
            shape = self._shape_of(info)
            if info.name not in self.types or shape is not None:
                self.types[info.name] = (shape, info.type.tensor_type.elem_type)
        grown = {o for n in self.graph.node if n.op_type in GROWING and n.domain in ("", "ai.onnx") for o in n.output}
        for name, (shape, elem) in declared.items():
            known, known_elem = self.types.get(name, (None, 0))
            if shape is not None and known is None and known_elem != -1 and name not in grown:
                self.types[name] = (shape, known_elem or elem)

    @staticmethod
    def _shape_of(info: onnx.ValueInfoProto) -> tuple[int, ...] | None:
        tt = info.type.tensor_type
        known = info.type.HasField("tensor_type") and tt.HasField("shape") and all(
            d.HasField("dim_value") for d in tt.shape.dim)
        return tuple(d.dim_value for d in tt.shape.dim) if known else None

    def dtype_of(self, elem_type: int, what: str) -> DType:
        dtype = ELEM_TYPES.get(elem_type)
        if dtype is None:
            kind = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
            raise ModelImportError(f"{what} has element type {kind}, which the IR does not support "
                                   f"(supported: {', '.join(d.value for d in ELEM_TYPES.values())})")
        return dtype

    def type_of(self, name: str, what: str) -> tuple[tuple[int, ...], DType]:
        shape, elem = self.types.get(name, (None, 0))
        if elem == -1:
            raise ModelImportError(f"{what} is a sequence or an optional, which the IR does not support")
        if shape is None:
            hint = f" (symbols: {sorted(self._symbols())})" if self._symbols() else ""
            raise ModelImportError(
                f"{what} has no static shape; the importer needs static shapes: export with fixed input shapes "
                f"or pass dims={{symbol: size}}{hint}")
        return _dims(list(shape), what), self.dtype_of(elem, what)

    def _symbols(self) -> set[str]:
        return {d.dim_param for i in self.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}

    def _convert(self, node: onnx.NodeProto) -> None:
        n = OnnxNode(self, node)
        if node.domain in ("", "ai.onnx") and node.op_type in FOLDABLE and n.foldable(FOLD_LIMIT):
            results: list[Value] = n.fold()
        else:
            converter = CONVERTERS.get((node.domain or "", node.op_type))
            results = converter(n) if converter is not None else n.as_opaque()
        for out, value in zip(node.output, results, strict=False):
            if out:
                self.values[out] = value


def _toposort(graph: onnx.GraphProto, defined: set[str]) -> list[onnx.NodeProto]:
    """Nodes in dependency order; refuses dangling references, duplicate producers and cycles."""
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for out in node.output:
            if out and (out in producer or out in defined):
                raise ModelImportError(f"tensor {out[:80]!r} is produced twice")
            if out:
                producer[out] = i
    waiting = [0] * len(graph.node)
    readers: dict[int, list[int]] = {}
    for i, node in enumerate(graph.node):
        for inp in set(node.input) - {""}:
            if inp in producer:
                waiting[i] += 1
                readers.setdefault(producer[inp], []).append(i)
            elif inp not in defined:
                raise ModelImportError(f"node {i} ({node.op_type}) reads {inp[:80]!r}, which nothing defines")
    for out in graph.output:
        if out.name not in producer and out.name not in defined:
            raise ModelImportError(f"graph output {out.name[:80]!r} is never produced")
    ready = [i for i, w in enumerate(waiting) if w == 0]
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in readers.get(i, []):
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) < len(graph.node):
        stuck = next(i for i, w in enumerate(waiting) if w)
        raise ModelImportError(f"the graph has a cycle through node {stuck} ({graph.node[stuck].op_type})")
    return [graph.node[i] for i in order]
