"""FAISS indexes from factory strings: ``Flat``, ``HNSW32``, ``IVF1024,PQ32`` with an L2 or inner-product metric."""

import re
from enum import StrEnum

import faiss

from db.errors import IndexConfigError


class Metric(StrEnum):
    L2 = "l2"
    IP = "ip"


_FAISS_METRIC = {Metric.L2: faiss.METRIC_L2, Metric.IP: faiss.METRIC_INNER_PRODUCT}


def parse_metric(name: str) -> Metric:
    try:
        return Metric(name.lower())
    except ValueError:
        raise IndexConfigError(f"unknown index metric {name!r}; choose 'l2' or 'ip'") from None


def new_index(factory: str, dim: int, metric: Metric) -> faiss.Index:
    """An empty index that takes explicit 64-bit ids (``add_with_ids``), built from a FAISS factory string."""
    try:
        inner = faiss.index_factory(dim, factory, _FAISS_METRIC[metric])
    except RuntimeError as e:
        raise IndexConfigError(f"invalid FAISS factory string {factory!r} (dim {dim}): {_first_line(e)}") from None
    index = faiss.IndexIDMap2(inner)
    index.own_fields = True
    inner.this.disown()
    return index


def set_search_params(index: faiss.Index, params: str) -> None:
    """Apply a FAISS parameter string such as ``efSearch=128`` or ``nprobe=16`` (empty: leave defaults)."""
    if not params:
        return
    try:
        faiss.ParameterSpace().set_index_parameters(index, params)
    except RuntimeError as e:
        raise IndexConfigError(f"invalid index search parameters {params!r}: {_first_line(e)}") from None


def _first_line(e: Exception) -> str:
    """FAISS messages read ``Error in <C++ signature> at <file>:<line>: <reason>``; keep the reason."""
    text = " ".join(str(e).split())
    return re.sub(r"^.*? at \S+:\d+: ", "", text) or type(e).__name__
