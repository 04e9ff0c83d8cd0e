"""Subgraph: one tuning unit cut out of a model graph by ``embed.partition``."""

from dataclasses import dataclass
from enum import StrEnum

from embed.ir import Graph


class SubgraphKind(StrEnum):
    POINTWISE = "pointwise"  # a chain of elementwise ops (with broadcasting)
    REDUCTION = "reduction"  # a reduction with its prologue/epilogue (softmax, norms, cross-entropy, sum/mean/max)
    CONTRACTION = "contraction"  # matmul/linear/bmm with its epilogue (bias, activation, residual, scale)
    CONVOLUTION = "convolution"  # conv2d / pooling with its epilogue
    SPARSE = "sparse"  # sparse x dense product (SpMM) with its epilogue
    LAYOUT = "layout"  # transpose/permute/reshape/concat/slice/gather
    OPAQUE = "opaque"  # holds an op outside the op set: not tunable


@dataclass(frozen=True)
class Subgraph:
    """A self-contained graph in canonical form, its kind and its hashes.

    ``graph`` has the subgraph's boundary tensors as its inputs (weights stay params) and is in
    canonical form (tensors renamed in topological order, attributes sorted).
    ``structural_hash`` covers ops, wiring, attributes, shapes and dtypes; ``family_hash`` the same
    without shapes. ``source_outputs`` maps the canonical outputs back to tensor names of the
    model graph, ``source_inputs`` the canonical inputs.
    """

    graph: Graph
    kind: SubgraphKind
    structural_hash: str
    family_hash: str
    source_inputs: tuple[str, ...]
    source_outputs: tuple[str, ...]
    not_tunable_reason: str | None = None

    @property
    def tunable(self) -> bool:
        return self.not_tunable_reason is None

    @property
    def ops(self) -> list[str]:
        return [n.op for n in self.graph.nodes]
