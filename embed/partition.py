"""Partitioner: cut a model graph into tuning units (``Subgraph``).

Every node lands in exactly one subgraph. Nodes are grouped by op class (``embed.ops``):

* An anchor (reduction, contraction, convolution or sparse node) heads a group of its kind; two
  anchors never share a group, except reductions over the same rows (same input shape and reduced
  axes), so a decomposed softmax or layer norm, or ``log_softmax`` + ``nll_loss`` (cross-entropy),
  stays one unit.
* Reduction prologue (decided first): a pointwise node that feeds a reduction directly joins the
  reduction's group (``add`` + ``layer_norm``, the scale and mask before ``softmax``), and so does,
  going backwards, every pointwise node all of whose consumers are already in that group; nodes
  that hang off an earlier reduction through pointwise nodes only are left to be its epilogue.
* Epilogue: walking the nodes in order, a pointwise node joins the group of a producer that is an
  anchor group (bias, activation, residual, scale, batch norm) when it can, else a pointwise group
  of a producer, so pointwise chains (with broadcasting) fuse. Contractions, convolutions and sparse
  products take no prologue.
* Layout ops (transpose, concat, slice, gather) form layout groups, merging with layout producers.
* Pure views (``reshape``, ``expand``) have no kernel of their own: they fuse like pointwise ops
  (``expand`` is a broadcast) as an epilogue, a reduction prologue or after a layout op; a view that
  fuses with nothing becomes a layout subgraph on its own.
* An opaque node is its own ``OPAQUE`` subgraph (``not_tunable_reason`` names the op) and splits
  whatever runs through it.

A merge is made only if it creates no cycle between groups (no path leaves the merged group and
comes back). An intermediate that a fused group bypasses but that is read elsewhere, or is a model
output, becomes an extra output of the group; so does a result no node reads.

Each subgraph's ``graph`` is standalone and canonical: its boundary tensors are its inputs (role
``input``; weights stay ``param``, constants stay ``const``). Subgraphs are returned in an
executable order: every subgraph comes after those that produce its inputs.
"""

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from embed.canonical import canonicalize_with_names, family_hash, structural_hash
from embed.ir import Graph, Node, Tensor, TensorRole, validated
from embed.ops import OpClass
from embed.subgraph import Subgraph, SubgraphKind

VIEWS = frozenset({"reshape", "expand"})
_ANCHORS = {
    OpClass.REDUCTION: SubgraphKind.REDUCTION,
    OpClass.CONTRACTION: SubgraphKind.CONTRACTION,
    OpClass.CONVOLUTION: SubgraphKind.CONVOLUTION,
    OpClass.SPARSE: SubgraphKind.SPARSE,
}
_Rows = tuple[tuple[int, ...], tuple[int, ...]]


@dataclass
class _Group:
    nodes: set[int]
    anchor: OpClass | None = None
    rows: _Rows | None = None  # what a reduction group reduces
    layout: bool = False
    pointwise: bool = False
    opaque: bool = False

    @property
    def pure(self) -> bool:
        """Only pointwise ops and views."""
        return not (self.anchor or self.layout or self.opaque)


@dataclass
class _Partitioner:
    graph: Graph
    group_of: list[int] = field(default_factory=list)
    groups: dict[int, _Group] = field(default_factory=dict)

    def __post_init__(self) -> None:
        graph = self.graph
        self.producer = graph.producers()
        self.consumers = graph.consumers()
        self.model_outputs = set(graph.outputs)
        self.successors = [
            sorted({c for out in node.outputs for c in self.consumers[out]}) for node in graph.nodes
        ]
        # Per group: its last node, and the nodes outside it that read it (so a merge's cycle check costs what the
        # groups' borders hold, not their sizes: a 20k-node chain partitions in linear time).
        self.last: dict[int, int] = {}
        self.frontier: dict[int, set[int]] = {}
        for i, node in enumerate(graph.nodes):
            self.group_of.append(i)
            self.groups[i] = self._singleton(i, node)
            self.last[i], self.frontier[i] = i, set(self.successors[i])
        # Pointwise nodes downstream of a reduction through pointwise nodes only: its epilogue candidates.
        self.reduction_epilogues: set[int] = set()
        for i, node in enumerate(graph.nodes):
            if self.groups[i].pure and any(
                t in self.producer
                and (self.producer[t] in self.reduction_epilogues or self.groups[self.producer[t]].rows is not None)
                for t in node.inputs
            ):
                self.reduction_epilogues.add(i)

    def _singleton(self, i: int, node: Node) -> _Group:
        cls = node.op_class
        group = _Group({i})
        if cls == OpClass.OPAQUE:
            group.opaque = True
        elif cls in _ANCHORS:
            group.anchor = cls
            if cls == OpClass.REDUCTION:
                group.rows = self._rows(node)
        elif cls == OpClass.LAYOUT and node.op not in VIEWS:
            group.layout = True
        elif cls == OpClass.POINTWISE:
            group.pointwise = True
        return group

    def _rows(self, node: Node) -> _Rows:
        shape = self.graph.tensors[node.inputs[0]].shape
        rank = max(len(shape), 1)
        if node.op in ("softmax", "log_softmax"):
            axes = [node.attrs["axis"]]
        elif node.op == "nll_loss":
            axes = [1]  # the class axis of [N, C]
        else:
            axes = list(node.attrs["axes"]) or list(range(rank))  # type: ignore[arg-type]
        return shape, tuple(sorted({a % rank for a in axes}))

    # -- groups ---------------------------------------------------------------------------------

    def group(self, i: int) -> int:
        return self.group_of[i]

    def _creates_cycle(self, a: int, b: int) -> bool:
        """Whether a path leaves groups ``a`` and ``b`` and comes back into one of them."""
        pair = (a, b)
        last = max(self.last[a], self.last[b])
        stack = [s for s in self.frontier[a] | self.frontier[b] if s <= last and self.group_of[s] not in pair]
        seen: set[int] = set()
        while stack:
            i = stack.pop()
            if i in seen or i > last:
                continue
            seen.add(i)
            for s in self.successors[i]:
                if self.group_of[s] in pair:
                    return True
                stack.append(s)
        return False

    def _merge(self, a: int, b: int) -> None:
        ga, gb = self.groups[a], self.groups.pop(b)
        self.last[a] = max(self.last[a], self.last.pop(b))
        border = self.frontier[a] | self.frontier.pop(b)
        self.frontier[a] = {s for s in border if s not in ga.nodes and s not in gb.nodes}
        ga.nodes |= gb.nodes
        ga.anchor = ga.anchor or gb.anchor
        ga.rows = ga.rows or gb.rows
        ga.layout |= gb.layout
        ga.pointwise |= gb.pointwise
        for i in gb.nodes:
            self.group_of[i] = a

    def try_merge(self, a: int, b: int) -> bool:
        if a == b or self._creates_cycle(a, b):
            return False
        self._merge(a, b)
        return True

    @staticmethod
    def _fusable(producer: _Group, consumer: _Group) -> bool:
        """Whether ``consumer`` may join ``producer`` in the epilogue walk."""
        if producer.opaque or consumer.opaque:
            return False
        if producer.anchor and consumer.anchor:
            return producer.anchor == consumer.anchor == OpClass.REDUCTION and producer.rows == consumer.rows
        if consumer.layout:
            return not (producer.anchor or producer.pointwise)
        if producer.layout:
            return consumer.pure and not consumer.pointwise
        if consumer.anchor:
            return False
        return not producer.anchor or len(consumer.nodes) == 1

    # -- passes ---------------------------------------------------------------------------------

    def claim_prologues(self) -> None:
        """Pull the pointwise prologue of every reduction into its group."""
        for r, node in enumerate(self.graph.nodes):
            if node.op_class != OpClass.REDUCTION:
                continue
            members = {r}
            direct = {self.producer[t] for t in node.inputs if t in self.producer}
            pending = [-p for p in direct]
            heapq.heapify(pending)
            while pending:
                p = -heapq.heappop(pending)
                if p in members or not self._claimable(p):
                    continue
                outs = self.graph.nodes[p].outputs
                escapes = any(o in self.model_outputs or any(c not in members for c in self.consumers[o]) for o in outs)
                if p not in direct and escapes:
                    continue
                if not self.try_merge(self.group(r), self.group(p)):
                    continue
                members.add(p)
                for t in self.graph.nodes[p].inputs:
                    if t in self.producer:
                        heapq.heappush(pending, -self.producer[t])

    def _claimable(self, i: int) -> bool:
        group = self.groups[self.group(i)]
        return len(group.nodes) == 1 and group.pure and i not in self.reduction_epilogues

    def fuse(self) -> None:
        """Walk the nodes in order and merge each into a producer group where the rules allow it."""
        for n, node in enumerate(self.graph.nodes):
            producers = dict.fromkeys(self.group(self.producer[t]) for t in node.inputs if t in self.producer)
            for pg in sorted(producers, key=lambda g: self.groups[g].anchor is None):
                g = self.group(n)
                if pg != g and self._fusable(self.groups[pg], self.groups[g]):
                    self.try_merge(pg, g)

    def ordered_groups(self) -> list[_Group]:
        """Groups in an executable order (Kahn's algorithm, earliest first node first)."""
        deps: dict[int, set[int]] = {g: set() for g in self.groups}
        for g, group in self.groups.items():
            for i in group.nodes:
                for t in self.graph.nodes[i].inputs:
                    if t in self.producer and self.group(self.producer[t]) != g:
                        deps[g].add(self.group(self.producer[t]))
        users: dict[int, list[int]] = {g: [] for g in self.groups}
        for g, ds in deps.items():
            for d in ds:
                users[d].append(g)
        waiting = {g: len(ds) for g, ds in deps.items()}
        ready = [(min(self.groups[g].nodes), g) for g, count in waiting.items() if count == 0]
        heapq.heapify(ready)
        order: list[_Group] = []
        while ready:
            _, g = heapq.heappop(ready)
            order.append(self.groups[g])
            for u in users[g]:
                waiting[u] -= 1
                if waiting[u] == 0:
                    heapq.heappush(ready, (min(self.groups[u].nodes), u))
        return order

    # -- subgraphs ------------------------------------------------------------------------------

    def subgraph(self, group: _Group, index: int) -> Subgraph:
        graph = self.graph
        nodes = [graph.nodes[i] for i in sorted(group.nodes)]
        produced = {o for node in nodes for o in node.outputs}
        read = [t for node in nodes for t in dict.fromkeys(node.inputs) if t not in produced]
        tensors: dict[str, Tensor] = {}
        for t in dict.fromkeys(read):
            tensor = graph.tensors[t]
            if tensor.role == TensorRole.INTERMEDIATE:
                tensor = tensor.model_copy(update={"role": TensorRole.INPUT})
            tensors[t] = tensor
        outputs = []
        for node in nodes:
            for o in node.outputs:
                tensors[o] = graph.tensors[o]
                users = self.consumers[o]
                if o in self.model_outputs or not users or any(c not in group.nodes for c in users):
                    outputs.append(o)
        data = {
            "name": f"{graph.name}#{index}",
            "tensors": tensors,
            "nodes": nodes,
            "inputs": tuple(t for t, v in tensors.items() if v.role in (TensorRole.INPUT, TensorRole.PARAM)),
            "outputs": tuple(outputs),
        }
        standalone = validated(Graph, data, f"subgraph {index} of graph {graph.name!r}")
        canonical, renaming = canonicalize_with_names(standalone)
        back = {new: old for old, new in renaming.items()}
        reason = None
        if group.opaque:
            reason = f"op {nodes[0].attrs['name']!r} is outside the op set"
        return Subgraph(
            graph=canonical,
            kind=self._kind(group),
            structural_hash=structural_hash(canonical),
            family_hash=family_hash(canonical),
            source_inputs=tuple(back[t] for t in canonical.inputs),
            source_outputs=tuple(back[t] for t in canonical.outputs),
            not_tunable_reason=reason,
        )

    @staticmethod
    def _kind(group: _Group) -> SubgraphKind:
        if group.opaque:
            return SubgraphKind.OPAQUE
        if group.anchor:
            return _ANCHORS[group.anchor]
        return SubgraphKind.POINTWISE if group.pointwise and not group.layout else SubgraphKind.LAYOUT


def partition(graph: Graph) -> list[Subgraph]:
    """Cut ``graph`` into tuning units, in an executable order (rules in the module docstring)."""
    return [sub for sub, _ in partition_nodes(graph)]


def partition_nodes(graph: Graph) -> list[tuple[Subgraph, tuple[int, ...]]]:
    """:func:`partition`, each subgraph with the indices of its nodes in ``graph``."""
    state = _Partitioner(graph)
    state.claim_prologues()
    state.fuse()
    return [(state.subgraph(group, k), tuple(sorted(group.nodes))) for k, group in enumerate(state.ordered_groups())]


def merged_subgraph(graph: Graph, nodes: Iterable[int], kind: SubgraphKind, index: int = 0) -> Subgraph:
    """The subgraph of ``graph`` made of ``nodes`` (a union of :func:`partition_nodes`' groups that a plan runs as
    one kernel: a layout subgraph folded into its neighbour), of ``kind`` (the neighbour's). The caller makes sure
    the union is convex (no path leaves it and comes back)."""
    state = _Partitioner(graph)
    first, *rest = sorted(set(nodes))
    for i in rest:
        state._merge(first, i)
    return replace(state.subgraph(state.groups[first], index), kind=kind)
