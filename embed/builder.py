"""GraphBuilder: the one way importers, the zoo and tests assemble a ``Graph``."""

from collections.abc import Sequence

from embed.errors import InvalidGraphError
from embed.ir import DType, Graph, Node, Tensor, TensorRole, validated


class GraphBuilder:
    """Collects tensors and nodes in order; ``build`` validates the result.

    >>> b = GraphBuilder("demo")
    >>> x = b.input("x", (4, 8), "float32")
    >>> y = b.node("relu", [x], (4, 8), "float32")
    >>> graph = b.build([y])
    """

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.tensors: dict[str, Tensor] = {}
        self.nodes: list[Node] = []
        self.inputs: list[str] = []
        self._counter = 0

    def _fresh(self, hint: str) -> str:
        while True:
            self._counter += 1
            name = f"{hint}{self._counter}"
            if name not in self.tensors:
                return name

    def _add(self, name: str | None, hint: str, tensor: dict) -> str:
        name = name or self._fresh(hint)
        if name in self.tensors:
            raise InvalidGraphError(f"tensor {name!r} declared twice")
        self.tensors[name] = validated(Tensor, tensor, f"tensor {name!r}")
        return name

    def input(self, name: str, shape: Sequence[int], dtype: DType | str) -> str:
        self._add(name, "in", {"shape": tuple(shape), "dtype": dtype, "role": TensorRole.INPUT})
        self.inputs.append(name)
        return name

    def param(self, name: str, shape: Sequence[int], dtype: DType | str) -> str:
        self._add(name, "w", {"shape": tuple(shape), "dtype": dtype, "role": TensorRole.PARAM})
        self.inputs.append(name)
        return name

    def const(self, value: float | Sequence[float], dtype: DType | str, shape: Sequence[int] = ()) -> str:
        values = (float(value),) if isinstance(value, (int, float)) else tuple(float(v) for v in value)
        tensor = {"shape": tuple(shape), "dtype": dtype, "role": TensorRole.CONST, "value": values}
        return self._add(None, "c", tensor)

    def node(
        self,
        op: str,
        inputs: Sequence[str],
        shape: Sequence[int],
        dtype: DType | str,
        /,
        *,
        name: str | None = None,
        **attrs: int | float | bool | str | list[int],
    ) -> str:
        """Append ``op(inputs)`` producing one tensor of ``shape``/``dtype``; returns its name."""
        out = self._add(name, "t", {"shape": tuple(shape), "dtype": dtype})
        self.nodes.append(
            validated(Node, {"op": op, "inputs": tuple(inputs), "outputs": (out,), "attrs": attrs}, f"node {op!r}")
        )
        return out

    def opaque(
        self, op_name: str, inputs: Sequence[str], outputs: Sequence[tuple[Sequence[int], DType | str]]
    ) -> list[str]:
        """Append an op outside the op set; returns its output names."""
        names = [self._add(None, "t", {"shape": tuple(s), "dtype": d}) for s, d in outputs]
        node = {"op": "opaque", "inputs": tuple(inputs), "outputs": tuple(names), "attrs": {"name": op_name[:256]}}
        self.nodes.append(validated(Node, node, f"node {op_name[:64]!r}"))
        return names

    def build(self, outputs: Sequence[str]) -> Graph:
        data = {
            "name": self.name,
            "tensors": self.tensors,
            "nodes": self.nodes,
            "inputs": tuple(self.inputs),
            "outputs": tuple(outputs),
        }
        return validated(Graph, data, f"graph {self.name!r}")
