"""Canonical form and hashes of a graph.

``canonicalize`` renames every tensor and re-lists the nodes in an order that depends only on the
graph's structure, never on tensor names or on the order in which independent nodes were listed:

1. Every node and tensor gets a structural label by colour refinement (Weisfeiler-Lehman style) on
   the dataflow graph: a label starts from what an element is (op and attributes; role, dtype,
   shape, constant value, graph-output flag), then each round hashes a bottom-up pass (a node's
   label with the labels of its inputs, in position order) and a top-down pass (a tensor's label
   with the multiset of (consumer label, position)), until the number of distinct labels stops
   growing.
2. Nodes are listed in topological order, picking among the ready nodes the one with the smallest
   key (label, canonical names of its inputs). Tensors are named in order of first appearance:
   ``in0, in1, ...`` (inputs), ``w0, ...`` (params), ``c0, ...`` (constants), ``t0, ...``
   (intermediates). Inputs no node reads come last, by label. ``inputs`` and ``outputs`` are listed
   in canonical name order; attributes are sorted by key and float attributes written as floats.

Nodes still tied after refinement are interchangeable (an automorphism swaps them) in every graph
but pathological ones that colour refinement cannot tell apart; there the listing order decides.

``structural_hash`` is the sha256 of the canonical JSON (ops, wiring, attributes, shapes, dtypes,
roles, constant values; the graph's name is left out). ``family_hash`` is the same computed with
shapes replaced by ranks, so graphs that differ only in sizes share it. Rank and dtype are kept
because they change the loop nest (its depth) and the code a kernel needs (vector width, tensor
cores); attributes that only restate sizes (``reshape``/``expand`` ``shape``, ``slice`` ``start``
and ``end``, ``spmm`` ``rows``) are dropped from the family form as well. The family form
computes its own canonical order, from labels without shapes.
"""

import hashlib
import heapq
import json
from collections.abc import Iterable
from typing import Any

from embed.ir import Graph, Node, Tensor, TensorRole
from embed.ops import FLOAT, OPS

_PREFIX = {TensorRole.INPUT: "in", TensorRole.PARAM: "w", TensorRole.CONST: "c", TensorRole.INTERMEDIATE: "t"}
_SIZE_ATTRS = {"reshape": {"shape"}, "expand": {"shape"}, "slice": {"start", "end"}, "spmm": {"rows"}}
_MAX_ROUNDS = 16


def _digest(*parts: object) -> str:
    return hashlib.blake2b(repr(parts).encode(), digest_size=12).hexdigest()


def _attrs(node: Node, shapes: bool) -> dict[str, Any]:
    spec = OPS[node.op].attrs
    dropped = set() if shapes else _SIZE_ATTRS.get(node.op, set())
    result: dict[str, Any] = {}
    for key in sorted(node.attrs):
        if key in dropped:
            continue
        value = node.attrs[key]
        result[key] = float(value) if spec.get(key) == FLOAT else value
    return result


def _tensor_doc(tensor: Tensor, shapes: bool) -> list[Any]:
    shape: Any = list(tensor.shape) if shapes else len(tensor.shape)
    return [shape, tensor.dtype.value, tensor.role.value, None if tensor.value is None else list(tensor.value)]


def _labels(graph: Graph, shapes: bool) -> tuple[list[str], dict[str, str]]:
    """Refined structural labels of the nodes (by index) and the tensors (by name)."""
    outputs = set(graph.outputs)
    consumers: dict[str, list[tuple[int, int]]] = {name: [] for name in graph.tensors}
    for i, node in enumerate(graph.nodes):
        for pos, name in enumerate(node.inputs):
            consumers[name].append((i, pos))
    producer = {out: (i, k) for i, node in enumerate(graph.nodes) for k, out in enumerate(node.outputs)}
    tensor_lab = {
        name: _digest(_tensor_doc(t, shapes), name in outputs) for name, t in graph.tensors.items()
    }
    node_lab = [_digest(n.op, _attrs(n, shapes)) for n in graph.nodes]
    distinct = len(set(tensor_lab.values())) + len(set(node_lab))
    for _ in range(_MAX_ROUNDS):
        up_t = {name: lab for name, lab in tensor_lab.items() if name not in producer}
        up_n: list[str] = []
        for i, node in enumerate(graph.nodes):
            up_n.append(_digest(node_lab[i], [up_t[name] for name in node.inputs]))
            for k, out in enumerate(node.outputs):
                up_t[out] = _digest(tensor_lab[out], up_n[i], k)
        down_t: dict[str, str] = {}
        down_n = [""] * len(graph.nodes)
        for i in reversed(range(len(graph.nodes))):
            for out in graph.nodes[i].outputs:
                down_t[out] = _digest(tensor_lab[out], sorted((down_n[c], p) for c, p in consumers[out]))
            down_n[i] = _digest(node_lab[i], [down_t[out] for out in graph.nodes[i].outputs])
        for name in graph.tensors:
            if name not in down_t:
                down_t[name] = _digest(tensor_lab[name], sorted((down_n[c], p) for c, p in consumers[name]))
        tensor_lab = {name: _digest(up_t[name], down_t[name]) for name in graph.tensors}
        node_lab = [_digest(up_n[i], down_n[i]) for i in range(len(graph.nodes))]
        now = len(set(tensor_lab.values())) + len(set(node_lab))
        if now == distinct:
            break
        distinct = now
    return node_lab, tensor_lab


def _canonical_order(graph: Graph, shapes: bool) -> tuple[list[int], dict[str, str]]:
    """Canonical node order and renaming (old tensor name -> canonical name)."""
    node_lab, tensor_lab = _labels(graph, shapes)
    producers = graph.producers()
    waiting = [len({producers[n] for n in node.inputs if n in producers}) for node in graph.nodes]
    dependents: dict[int, set[int]] = {i: set() for i in range(len(graph.nodes))}
    for i, node in enumerate(graph.nodes):
        for name in node.inputs:
            if name in producers:
                dependents[producers[name]].add(i)
    renaming: dict[str, str] = {}
    appearance: dict[str, int] = {}
    counters = dict.fromkeys(_PREFIX.values(), 0)

    def name(tensors: Iterable[str]) -> None:
        for tensor in tensors:
            if tensor not in renaming:
                prefix = _PREFIX[graph.tensors[tensor].role]
                renaming[tensor] = f"{prefix}{counters[prefix]}"
                appearance[tensor] = len(appearance)
                counters[prefix] += 1

    def key(i: int) -> tuple[list[tuple[int, int | str]], int]:
        # A ready node's inputs are named, except graph inputs no earlier node read.
        return [(0, appearance[t]) if t in appearance else (1, tensor_lab[t]) for t in graph.nodes[i].inputs], i

    ready: dict[str, list[int]] = {}
    heap: list[str] = []

    def make_ready(i: int) -> None:
        tied = ready.setdefault(node_lab[i], [])
        if not tied:
            heapq.heappush(heap, node_lab[i])
        tied.append(i)

    for i, count in enumerate(waiting):
        if count == 0:
            make_ready(i)
    order: list[int] = []
    while heap:
        tied = ready[heap[0]]
        best = min(tied, key=key) if len(tied) > 1 else tied[0]
        tied.remove(best)
        if not tied:
            heapq.heappop(heap)
        order.append(best)
        name(graph.nodes[best].inputs)
        name(graph.nodes[best].outputs)
        for j in sorted(dependents[best]):
            waiting[j] -= 1
            if waiting[j] == 0:
                make_ready(j)
    name(sorted((t for t in graph.tensors if t not in renaming), key=lambda t: (tensor_lab[t], t)))
    return order, renaming


def _document(graph: Graph, order: list[int], renaming: dict[str, str], shapes: bool) -> dict[str, Any]:
    """The canonical document of ``graph`` (what is hashed and what ``canonicalize`` rebuilds)."""
    index = {new: k for k, new in enumerate(renaming.values())}
    rank = {old: index[new] for old, new in renaming.items()}
    return {
        "tensors": {renaming[t]: _tensor_doc(graph.tensors[t], shapes) for t in sorted(graph.tensors, key=rank.get)},
        "nodes": [
            [
                graph.nodes[i].op,
                [renaming[t] for t in graph.nodes[i].inputs],
                [renaming[t] for t in graph.nodes[i].outputs],
                _attrs(graph.nodes[i], shapes),
            ]
            for i in order
        ],
        "inputs": [renaming[t] for t in sorted(graph.inputs, key=rank.get)],
        "outputs": [renaming[t] for t in sorted(graph.outputs, key=rank.get)],
    }


def canonicalize_with_names(graph: Graph) -> tuple[Graph, dict[str, str]]:
    """The canonical form of ``graph`` and the renaming it applied (old name -> canonical name)."""
    order, renaming = _canonical_order(graph, shapes=True)
    tensors = {renaming[old]: tensor for old, tensor in graph.tensors.items()}
    doc = _document(graph, order, renaming, shapes=True)
    nodes = [Node(op=op, inputs=tuple(ins), outputs=tuple(outs), attrs=attrs) for op, ins, outs, attrs in doc["nodes"]]
    canonical = Graph(
        name=graph.name,
        tensors={name: tensors[name] for name in doc["tensors"]},
        nodes=tuple(nodes),
        inputs=tuple(doc["inputs"]),
        outputs=tuple(doc["outputs"]),
    )
    return canonical, renaming


def canonicalize(graph: Graph) -> Graph:
    """``graph`` with tensors renamed and nodes listed in canonical order (see the module docstring)."""
    return canonicalize_with_names(graph)[0]


def _hash(graph: Graph, shapes: bool) -> str:
    order, renaming = _canonical_order(graph, shapes)
    text = json.dumps(_document(graph, order, renaming, shapes), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def structural_hash(graph: Graph) -> str:
    """sha256 hex of the canonical JSON: ops, wiring, attributes, shapes, dtypes, roles, constants."""
    return _hash(graph, shapes=True)


def family_hash(graph: Graph) -> str:
    """Like ``structural_hash`` with shapes (and size attributes) replaced by ranks."""
    return _hash(graph, shapes=False)
