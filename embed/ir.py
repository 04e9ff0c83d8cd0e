"""Graph IR: tensors, nodes from the closed op set (``embed.ops``), and graphs.

The IR is a set of pydantic models whose schema bounds everything a document can hold (rank,
dimension sizes, element count, node count, string lengths), so a hostile JSON document is refused
with one clear message (``InvalidGraphError``) before anything else reads it.

A ``Graph`` is in topological order: every node reads tensors that are graph inputs, parameters,
constants or outputs of earlier nodes.
"""

import math
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from embed.errors import InvalidGraphError
from embed.ops import BOOL, FLOAT, INT, INTS, OPS, STR, OpClass, op_class

MAX_RANK = 8
MAX_DIM = 2**31 - 1
MAX_ELEMENTS = 2**36
MAX_NODES = 20_000
MAX_TENSORS = 4 * MAX_NODES
MAX_NAME = 256
MAX_LIST = 64
MAX_CONST_ELEMENTS = 64

Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME)]
AttrValue = (
    int | float | bool | Annotated[str, Field(max_length=MAX_NAME)] | Annotated[list[int], Field(max_length=MAX_LIST)]
)


class DType(StrEnum):
    FLOAT64 = "float64"
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    INT64 = "int64"
    INT32 = "int32"
    BOOL = "bool"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.FLOAT64, DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)


_ITEMSIZE = {
    DType.FLOAT64: 8,
    DType.FLOAT32: 4,
    DType.FLOAT16: 2,
    DType.BFLOAT16: 2,
    DType.INT64: 8,
    DType.INT32: 4,
    DType.BOOL: 1,
}


class TensorRole(StrEnum):
    INPUT = "input"  # supplied at run time
    PARAM = "param"  # a weight: supplied once, constant across calls
    CONST = "const"  # a small literal carried in the IR (``value``)
    INTERMEDIATE = "intermediate"  # produced by a node


class Tensor(BaseModel):
    """A tensor: shape, dtype, role; ``value`` holds the elements of a small constant (row-major)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    shape: Annotated[tuple[Annotated[int, Field(ge=0, le=MAX_DIM)], ...], Field(max_length=MAX_RANK)]
    dtype: DType
    role: TensorRole = TensorRole.INTERMEDIATE
    value: Annotated[tuple[float, ...], Field(max_length=MAX_CONST_ELEMENTS)] | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @model_validator(mode="after")
    def _check(self) -> "Tensor":
        if self.numel > MAX_ELEMENTS:
            raise ValueError(f"shape {list(self.shape)} has {self.numel} elements, over the limit of {MAX_ELEMENTS}")
        if (self.role == TensorRole.CONST) != (self.value is not None):
            raise ValueError("a tensor carries a value exactly when its role is 'const'")
        if self.value is not None and len(self.value) != self.numel:
            raise ValueError(f"constant has {len(self.value)} values for shape {list(self.shape)}")
        return self


_ATTR_CHECK = {
    INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
    FLOAT: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    BOOL: lambda v: isinstance(v, bool),
    STR: lambda v: isinstance(v, str),
    INTS: lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
}


class Node(BaseModel):
    """One op application. ``attrs`` are checked against the op's schema in ``embed.ops``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: Annotated[str, Field(max_length=64)]
    inputs: Annotated[tuple[Name, ...], Field(max_length=MAX_LIST)]
    outputs: Annotated[tuple[Name, ...], Field(min_length=1, max_length=MAX_LIST)]
    attrs: Annotated[dict[Name, AttrValue], Field(max_length=MAX_LIST)] = Field(default_factory=dict)

    @property
    def op_class(self) -> OpClass:
        return op_class(self.op)

    @model_validator(mode="after")
    def _check(self) -> "Node":
        spec = OPS.get(self.op)
        if spec is None:
            raise ValueError(f"unknown op {self.op!r}; importers turn ops outside the op set into 'opaque' nodes")
        lo, hi = spec.arity
        if not lo <= len(self.inputs) <= hi:
            raise ValueError(f"op {self.op!r} takes {lo}..{hi} inputs, got {len(self.inputs)}")
        if self.op != "opaque" and len(self.outputs) != 1:
            raise ValueError(f"op {self.op!r} has one output, got {len(self.outputs)}")
        for key, value in self.attrs.items():
            kind = spec.attrs.get(key)
            if kind is None:
                raise ValueError(f"op {self.op!r} has no attribute {key!r} (it takes {sorted(spec.attrs)})")
            if not _ATTR_CHECK[kind](value):
                raise ValueError(f"attribute {key!r} of op {self.op!r} must be {kind}, got {value!r}")
        missing = spec.required - set(self.attrs)
        if missing:
            raise ValueError(f"op {self.op!r} needs attributes {sorted(missing)}")
        return self


class Graph(BaseModel):
    """A dataflow graph in topological order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    name: Annotated[str, Field(max_length=MAX_NAME)] = ""
    tensors: Annotated[dict[Name, Tensor], Field(max_length=MAX_TENSORS)]
    nodes: Annotated[tuple[Node, ...], Field(max_length=MAX_NODES)]
    inputs: Annotated[tuple[Name, ...], Field(max_length=MAX_TENSORS)]
    outputs: Annotated[tuple[Name, ...], Field(min_length=1, max_length=MAX_TENSORS)]

    @model_validator(mode="after")
    def _check(self) -> "Graph":
        defined = {n for n, t in self.tensors.items() if t.role != TensorRole.INTERMEDIATE}
        for name in self.inputs:
            role = self._tensor(name, "graph input").role
            if role not in (TensorRole.INPUT, TensorRole.PARAM):
                raise ValueError(f"graph input {name!r} has role {role.value!r}")
        for i, node in enumerate(self.nodes):
            for name in node.inputs:
                self._tensor(name, f"input of node {i} ({node.op})")
                if name not in defined:
                    raise ValueError(f"node {i} ({node.op}) reads {name!r} before it is produced")
            for name in node.outputs:
                if self._tensor(name, f"output of node {i} ({node.op})").role != TensorRole.INTERMEDIATE:
                    raise ValueError(f"node {i} ({node.op}) writes {name!r}, which is not an intermediate")
                if name in defined:
                    raise ValueError(f"tensor {name!r} is produced twice")
                defined.add(name)
        for name in self.outputs:
            self._tensor(name, "graph output")
            if name not in defined:
                raise ValueError(f"graph output {name!r} is never produced")
        return self

    def _tensor(self, name: str, what: str) -> Tensor:
        tensor = self.tensors.get(name)
        if tensor is None:
            raise ValueError(f"{what} {name!r} is not a declared tensor")
        return tensor

    def producers(self) -> dict[str, int]:
        """Tensor name -> index of the node that produces it."""
        return {out: i for i, node in enumerate(self.nodes) for out in node.outputs}

    def consumers(self) -> dict[str, list[int]]:
        """Tensor name -> indices of the nodes that read it, in order."""
        result: dict[str, list[int]] = {name: [] for name in self.tensors}
        for i, node in enumerate(self.nodes):
            for name in dict.fromkeys(node.inputs):
                result[name].append(i)
        return result

    def to_json(self) -> str:
        return self.model_dump_json()


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {msg}{more}" if where else f"{msg}{more}"


def validated(model: type[BaseModel], data: Any, what: str) -> Any:
    """Build ``model`` from ``data`` or raise ``InvalidGraphError`` naming the first problem."""
    try:
        if isinstance(data, (str, bytes)):
            return model.model_validate_json(data)
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidGraphError(f"invalid {what}: {_first_error(exc)}") from None


def graph_from_json(document: str | bytes) -> Graph:
    """Parse and validate a graph document; raises ``InvalidGraphError`` with the first problem."""
    return validated(Graph, document, "graph document")


def graph_json_schema() -> dict[str, Any]:
    """The JSON schema of a graph document (for the API's docs and clients)."""
    return Graph.model_json_schema()
