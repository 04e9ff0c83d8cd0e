"""Algebraic reordering of sparse-dense chains: ``A·(X·W)`` (a GCN layer as the zoo writes it) vs ``(A·X)·W``.

The two orders cross subgraphs (a contraction, then a sparse product), so this is a graph rewrite rather than a
recipe step. A *chain* is a 2-D ``matmul`` of ``X`` by a weight ``W`` (a param) whose output is read only by one
``spmm``, as its dense operand. Rewritten, the ``spmm`` runs on ``X`` and the ``matmul`` by ``W`` follows and
writes the ``spmm``'s old output, so every consumer and every graph output is unchanged.

    graphs = chain_orders(graph)   # [graph, graph with chain 1 reordered, graph with chain 2 reordered, ...]
"""

from __future__ import annotations

from embed.errors import InvalidGraphError
from embed.ir import Graph, Node, Tensor, TensorRole


def chains(graph: Graph) -> list[tuple[int, int]]:
    """(matmul node, spmm node) index pairs that can be reordered (see the module docstring)."""
    consumers = graph.consumers()
    found = []
    for i, node in enumerate(graph.nodes):
        if node.op != "matmul" or len(graph.tensors[node.inputs[0]].shape) != 2:
            continue
        if graph.tensors[node.inputs[1]].role != TensorRole.PARAM or node.outputs[0] in graph.outputs:
            continue
        readers = consumers[node.outputs[0]]
        if len(readers) == 1 and graph.nodes[readers[0]].op == "spmm":
            spmm = graph.nodes[readers[0]]
            if spmm.inputs[3] == node.outputs[0] and node.outputs[0] not in spmm.inputs[:3]:
                found.append((i, readers[0]))
    return found


def reorder(graph: Graph, chain: tuple[int, int]) -> Graph:
    """``graph`` with ``chain`` = (matmul, spmm) computed as the spmm of ``X`` followed by the matmul by ``W``."""
    m, s = chain
    matmul, spmm = graph.nodes[m], graph.nodes[s]
    x, w = matmul.inputs
    out = graph.tensors[spmm.outputs[0]]
    x_t, w_t = graph.tensors[x], graph.tensors[w]
    n = w_t.shape[0] if matmul.attrs.get("transpose_b") else w_t.shape[-1]
    rows = int(spmm.attrs["rows"])  # type: ignore[arg-type]
    if out.shape != (rows, n):
        raise InvalidGraphError(f"chain {matmul.outputs[0]} -> {spmm.outputs[0]}: (A·X)·W would be {(rows, n)}, "
                                f"not {out.shape}")
    ax = _fresh(graph, f"{spmm.outputs[0]}_ax")
    tensors = {k: v for k, v in graph.tensors.items() if k != matmul.outputs[0]}
    tensors[ax] = Tensor(shape=(rows, x_t.shape[1]), dtype=out.dtype, role=TensorRole.INTERMEDIATE)
    first = Node(op="spmm", inputs=(*spmm.inputs[:3], x), outputs=(ax,), attrs=spmm.attrs)
    second = Node(op="matmul", inputs=(ax, w), outputs=spmm.outputs, attrs=matmul.attrs)
    nodes = [nd for i, nd in enumerate(graph.nodes) if i != m]
    at = s - 1  # the spmm's position once the matmul is gone
    nodes[at: at + 1] = [first, second]
    return Graph(name=graph.name, tensors=tensors, nodes=tuple(nodes), inputs=graph.inputs, outputs=graph.outputs)


def chain_orders(graph: Graph) -> list[Graph]:
    """``graph`` itself, then one rewritten graph per chain (that chain alone reordered)."""
    return [graph, *(reorder(graph, c) for c in chains(graph))]


def describe(graph: Graph, chain: tuple[int, int]) -> str:
    """A short name for ``chain``: ``spmm(A, X·W) -> t5``."""
    matmul, spmm = graph.nodes[chain[0]], graph.nodes[chain[1]]
    return f"spmm(A, {matmul.inputs[0]}·{matmul.inputs[1]}) -> {spmm.outputs[0]}"


def _fresh(graph: Graph, base: str) -> str:
    name, k = base, 0
    while name in graph.tensors:
        k += 1
        name = f"{base}{k}"
    return name
