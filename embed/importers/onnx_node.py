"""``OnnxNode``: typed access to one ONNX node's inputs, attributes and inferred outputs during import."""

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from embed.errors import ModelImportError
from embed.ir import MAX_LIST, DType

if TYPE_CHECKING:
    from embed.importers.onnx_importer import _Importer

Value = str | np.ndarray | list[str]  # an IR tensor, a static array, or a sequence
NP_DTYPES = {"float32": DType.FLOAT32, "float64": DType.FLOAT64, "float16": DType.FLOAT16,
             "bfloat16": DType.BFLOAT16, "int64": DType.INT64, "int32": DType.INT32, "bool": DType.BOOL}
GROWING = frozenset({"Expand", "ConstantOfShape", "Range", "Tile"})  # outputs may dwarf inputs


class OnnxNode:
    """One ONNX node under conversion: typed access to its inputs, attributes and inferred outputs."""

    def __init__(self, imp: "_Importer", node: onnx.NodeProto) -> None:
        self.imp, self.node, self.lw = imp, node, imp.lw
        self._attrs = {a.name: a for a in node.attribute}

    def attr(self, name: str, default: Any = None) -> Any:
        if name not in self._attrs:
            return default
        value = helper.get_attribute_value(self._attrs[name])
        if isinstance(value, bytes):
            return value.decode(errors="replace")
        if isinstance(value, list) and len(value) > MAX_LIST:
            raise ModelImportError(f"attribute {name!r} has {len(value)} entries, over the limit of {MAX_LIST}")
        return value

    def has(self, i: int) -> bool:
        return i < len(self.node.input) and self.node.input[i] != ""

    def static(self, i: int) -> np.ndarray | None:
        value = self.imp.values[self.node.input[i]] if self.has(i) else None
        return value if isinstance(value, np.ndarray) else None

    def ints(self, i: int) -> list[int]:
        value = self.static(i)
        if value is None:
            raise ModelImportError(f"input {i} must be a constant (static shapes and axes only)")
        return [int(v) for v in value.reshape(-1)]

    def x(self, i: int) -> str:
        return self.materialize(self.imp, self.node.input[i])

    def shape(self, i: int) -> tuple[int, ...]:
        value = self.imp.values[self.node.input[i]]
        return tuple(value.shape) if isinstance(value, np.ndarray) else self.lw.shape(value)

    def out(self, k: int = 0) -> tuple[tuple[int, ...], DType]:
        return self.imp.type_of(self.node.output[k], f"output {self.node.output[k][:80]!r}")

    def emit(self, op: str, inputs: list[str], /, **attrs: object) -> str:
        shape, dtype = self.out()
        return self.lw.emit(op, inputs, shape, dtype, **attrs)

    def uses_extra_outputs(self) -> bool:
        return any(o for o in self.node.output[1:])

    def as_opaque(self) -> list[Value]:
        inputs = [self.x(i) for i in range(len(self.node.input)) if self.has(i)]
        present = [k for k, o in enumerate(self.node.output) if o]
        domain = self.node.domain if self.node.domain not in ("", "ai.onnx") else ""
        names = self.lw.opaque(f"{domain}::{self.node.op_type}" if domain else self.node.op_type,
                               inputs, [self.out(k) for k in present])
        result: list[Value] = [""] * len(self.node.output)
        for k, name in zip(present, names, strict=True):
            result[k] = name
        return result

    def foldable(self, limit: int) -> bool:
        present = [i for i in range(len(self.node.input)) if self.has(i)]
        if not present or any(self.static(i) is None for i in present):
            return False
        if self.node.op_type in GROWING:  # their output may dwarf their inputs: fold only when computed small
            size = self._grown_size()
            return size is not None and size <= limit
        shapes = [self.imp.types.get(o, (None, 0))[0] for o in self.node.output]
        return all(s is None or math.prod(s) <= limit for s in shapes)

    def _grown_size(self) -> int | None:
        """Elements of the output of Expand, ConstantOfShape, Range or Tile, computed from the input values (never
        from the file's declarations), or None when they do not say."""
        try:
            op = self.node.op_type
            if op == "ConstantOfShape":
                return math.prod(max(d, 0) for d in self.ints(0))
            if op == "Expand":
                target = self.ints(1)
                shape = self.shape(0)
                rank = max(len(shape), len(target))
                dims = [1] * (rank - len(shape)) + list(shape), [1] * (rank - len(target)) + target
                return math.prod(max(a, b, 0) for a, b in zip(*dims, strict=True))
            if op == "Range":
                start, end, delta = (float(self.static(i).reshape(-1)[0]) for i in range(3))  # type: ignore[union-attr]
                return max(math.ceil((end - start) / delta), 0) if delta else None
            if op == "Tile":
                return math.prod(self.shape(0)) * math.prod(max(r, 0) for r in self.ints(1))
        except (ModelImportError, ValueError, TypeError, OverflowError, IndexError, AttributeError):
            return None
        return None

    def fold(self) -> list[Value]:
        feeds = {self.node.input[i]: self.static(i) for i in range(len(self.node.input)) if self.has(i)}
        return [np.asarray(v) for v in ReferenceEvaluator(self.node).run(None, feeds)]

    @staticmethod
    def materialize(imp: "_Importer", name: str) -> str:
        value = imp.values.get(name)
        if value is None:
            raise ModelImportError(f"tensor {name[:80]!r} is not defined")
        if isinstance(value, str):
            return value
        dtype = NP_DTYPES.get(value.dtype.name)
        if dtype is None:
            raise ModelImportError(f"constant {name[:80]!r} has dtype {value.dtype.name}, unsupported by the IR")
        imp.values[name] = ir = imp.lw.array(value, dtype, name)
        return ir
