"""``TorchNode``: one FX node under conversion, with its schema-bound arguments and output shape/dtype."""

import operator
from typing import Any

import torch

from embed.errors import ModelImportError
from embed.importers.lowering import Lowering
from embed.ir import DType

TValue = Any  # an IR tensor name, a Python scalar, a list of values, or None
_DTYPES = {torch.float32: DType.FLOAT32, torch.float64: DType.FLOAT64, torch.float16: DType.FLOAT16,
           torch.bfloat16: DType.BFLOAT16, torch.int64: DType.INT64, torch.int32: DType.INT32, torch.bool: DType.BOOL}


def dtype_of(dtype: torch.dtype, what: str) -> DType:
    if dtype not in _DTYPES:
        raise ModelImportError(f"{what} has dtype {dtype}, which the IR does not support")
    return _DTYPES[dtype]


def static_shape(val: torch.Tensor, what: str) -> tuple[int, ...]:
    if not all(isinstance(d, int) for d in val.shape):
        raise ModelImportError(f"{what} has a symbolic shape {list(val.shape)}; the importer needs static shapes")
    return tuple(val.shape)


class TorchNode:
    """One FX node under conversion: its schema-bound arguments and its output's shape/dtype."""

    def __init__(self, lw: Lowering, env: dict[str, TValue], node: torch.fx.Node) -> None:
        self.lw, self.env, self.node = lw, env, node
        schema = getattr(node.target, "_schema", None)
        name = schema.name if schema is not None else getattr(node.target, "__name__", str(node.target))
        self.key = name.removeprefix("aten::").rstrip("_").replace("::", ".")
        self.args: dict[str, Any] = {}
        for i, arg in enumerate(schema.arguments if schema is not None else []):
            if i < len(node.args) and not arg.kwarg_only:
                self.args[arg.name] = node.args[i]
            elif arg.name in node.kwargs:
                self.args[arg.name] = node.kwargs[arg.name]
            else:
                self.args[arg.name] = arg.default_value if arg.has_default_value() else None

    def val(self, name: str) -> TValue:
        return self._resolve(self.args.get(name))

    def _resolve(self, value: Any) -> TValue:
        if isinstance(value, torch.fx.Node):
            return self.env[value.name]
        if isinstance(value, (list, tuple)):
            return [self._resolve(v) for v in value]
        return value

    def x(self, name: str, dtype: DType | None = None) -> str:
        value = self.val(name)
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float, bool)):
            return self.lw.const(float(value), dtype or self.out()[1])
        raise ModelImportError(f"argument {name!r} is not a tensor the importer could map")

    def rank(self, name: str) -> int:
        return len(self.lw.shape(self.x(name)))

    def out(self) -> tuple[tuple[int, ...], DType]:
        val = self.node.meta.get("val")
        if isinstance(val, (list, tuple)):
            val = val[0]
        if not isinstance(val, torch.Tensor):
            raise ModelImportError("the node has no tensor output")
        return static_shape(val, self.node.name), dtype_of(val.dtype, self.node.name)

    def emit(self, op: str, inputs: list[str], /, **attrs: object) -> str:
        shape, dtype = self.out()
        return self.lw.emit(op, inputs, shape, dtype, **attrs)

    def extra_outputs_used(self) -> bool:
        return any(u.target is operator.getitem and u.args[1] != 0 for u in self.node.users)

    def as_opaque(self) -> TValue:
        inputs = [v for v in _flatten([self._resolve(a) for a in (*self.node.args, *self.node.kwargs.values())])
                  if isinstance(v, str)]
        val = self.node.meta.get("val")
        vals = list(val) if isinstance(val, (list, tuple)) else [val]
        tensors = [(i, v) for i, v in enumerate(vals) if isinstance(v, torch.Tensor)]
        if not tensors:
            return None
        what = self.node.name
        names = self.lw.opaque(str(self.node.target), inputs,
                               [(static_shape(v, what), dtype_of(v.dtype, what)) for _, v in tensors])
        if not isinstance(val, (list, tuple)):
            return names[0]
        result: list[TValue] = [None] * len(vals)
        for (i, _), name in zip(tensors, names, strict=True):
            result[i] = name
        return result


def _flatten(values: list[Any]) -> list[Any]:
    return [x for v in values for x in (_flatten(v) if isinstance(v, list) else [v])]
