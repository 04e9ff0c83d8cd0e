"""Peephole normalisation applied by both importers, so equivalent spellings give the same IR.

- ``transpose`` of the last two axes read only as a matmul's right operand -> ``matmul(transpose_b=...)``
- ``mul(a, sigmoid(a))`` -> ``silu(a)``;  ``reciprocal(sqrt(a))`` -> ``rsqrt(a)``
- nodes whose outputs nobody reads, and params/constants nobody reads, are dropped
"""

from embed.ir import Graph, Node, TensorRole, validated


def _swaps_last_two(perm: list[int]) -> bool:
    n = len(perm)
    return n >= 2 and perm == [*range(n - 2), n - 1, n - 2]


def _fold(graph: Graph) -> list[Node]:
    nodes = list(graph.nodes)
    producer = graph.producers()
    consumers = graph.consumers()
    outputs = set(graph.outputs)

    def sole_use(tensor: str) -> bool:
        return tensor not in outputs and len(consumers[tensor]) == 1

    def made_by(tensor: str, op: str) -> Node | None:
        i = producer.get(tensor)
        return nodes[i] if i is not None and nodes[i].op == op else None

    for i, node in enumerate(nodes):
        if node.op == "matmul":
            t = made_by(node.inputs[1], "transpose")
            readers = consumers[node.inputs[1]]
            if (
                t is not None and node.inputs[1] not in outputs and _swaps_last_two(list(t.attrs["perm"]))  # type: ignore[arg-type]
                and all(nodes[j].op == "matmul" and nodes[j].inputs[0] != node.inputs[1] for j in readers)
            ):
                flipped = not node.attrs.get("transpose_b", False)
                nodes[i] = node.model_copy(update={
                    "inputs": (node.inputs[0], t.inputs[0]), "attrs": {**node.attrs, "transpose_b": flipped},
                })
        elif node.op == "mul":
            for a, s in (node.inputs, node.inputs[::-1]):
                sig = made_by(s, "sigmoid")
                if sig is not None and sig.inputs[0] == a and sole_use(s):
                    nodes[i] = Node(op="silu", inputs=(a,), outputs=node.outputs)
                    break
        elif node.op == "reciprocal":
            sqrt = made_by(node.inputs[0], "sqrt")
            if sqrt is not None and sole_use(node.inputs[0]):
                nodes[i] = Node(op="rsqrt", inputs=sqrt.inputs, outputs=node.outputs)
    return nodes


def _live(graph: Graph, nodes: list[Node]) -> tuple[list[Node], set[str]]:
    needed = set(graph.outputs)
    kept: list[Node] = []
    for node in reversed(nodes):
        if needed.intersection(node.outputs):
            kept.append(node)
            needed.update(node.inputs, node.outputs)
    return kept[::-1], needed


def normalize(graph: Graph) -> Graph:
    """``graph`` with the rewrites above applied (a new, validated graph)."""
    nodes, needed = _live(graph, _fold(graph))
    tensors = {
        name: t for name, t in graph.tensors.items() if name in needed or t.role == TensorRole.INPUT
    }
    data = {
        "name": graph.name,
        "tensors": tensors,
        "nodes": nodes,
        "inputs": tuple(n for n in graph.inputs if n in tensors),
        "outputs": graph.outputs,
    }
    return validated(Graph, data, f"graph {graph.name!r}")
