"""Sparse graphs for the SpMM benchmark, and tunebank tasks built from a given CSR (not ``random_inputs``).

    csr = uniform(100_000, 16, seed=0)           # every row exactly 16 distinct columns
    csr = powerlaw(100_000, 16, seed=0)          # Pareto row degrees with mean ~16, heavy tail
    task = spmm_task(csr, feats=64, seed=0)      # graph, loop program and validation Problem on this CSR

Columns are drawn uniformly (distinct and sorted within a row), so the dense rows a row gathers are scattered
over the whole feature matrix. Values are the GCN normalisation ``1 / sqrt(deg_out(i) * deg_in(j))``. Index
arrays are int32 (what cuSPARSE takes), values and features float32. The float64 reference is the CSR product
computed by SciPy: ``embed.evaluate`` computes the same sum, but spans every row to the longest one, which for a
heavy-tailed graph of 10^5-10^6 rows needs tens of GiB (tests check the two agree on small graphs). The tolerance
is ``transforms.tune.tolerances`` on these inputs (widened by the longest row of the CSR).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from embed.builder import GraphBuilder
from embed.ir import Graph
from embed.lower import lower
from transforms.codegen.kernel import compute_dtype
from transforms.codegen.signature import signature
from transforms.problem import tolerances
from transforms.run import Problem
from transforms.tune import Task


@dataclass(frozen=True, eq=False)
class Csr:
    """A square sparse matrix ``n x n`` in CSR form (int32 indices, float32 values)."""

    name: str
    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray

    @property
    def n(self) -> int:
        return len(self.indptr) - 1

    @property
    def nnz(self) -> int:
        return len(self.indices)

    @property
    def degrees(self) -> np.ndarray:
        return np.diff(self.indptr)

    def stats(self) -> dict[str, float]:
        """Row-degree mean, max and coefficient of variation (the skew), and density nnz / n^2."""
        d = self.degrees.astype(np.float64)
        mean = float(d.mean()) if d.size else 0.0
        return {"n": self.n, "nnz": self.nnz, "deg_mean": mean, "deg_max": int(d.max(initial=0)),
                "deg_cv": float(d.std() / mean) if mean else 0.0, "density": self.nnz / max(self.n, 1) ** 2}


def _sorted_distinct(keys: np.ndarray) -> np.ndarray:
    keys = np.sort(keys)  # np.unique's hash path is an order of magnitude slower on 10^7 keys
    return keys[np.concatenate([[True], keys[1:] != keys[:-1]])] if keys.size else keys


def _distinct_columns(rng: np.random.Generator, degrees: np.ndarray, n: int) -> np.ndarray:
    """For each row ``r``, ``degrees[r]`` distinct columns in ``[0, n)``, sorted, rows concatenated in order."""
    if (degrees > n).any():
        raise ValueError(f"a row degree exceeds the {n} columns")
    rows = np.arange(len(degrees), dtype=np.int64)
    keys = _sorted_distinct(np.repeat(rows, degrees) * n + rng.integers(0, n, int(degrees.sum())))
    while keys.size < degrees.sum():  # redraw the duplicates that were dropped
        missing = degrees - np.bincount(keys // n, minlength=len(degrees))
        extra = np.repeat(rows, missing)
        keys = _sorted_distinct(np.concatenate([keys, extra * n + rng.integers(0, n, extra.size)]))
    return keys % n


def from_degrees(name: str, degrees: np.ndarray, *, seed: int) -> Csr:
    """A CSR with the given row degrees, uniform distinct columns and GCN-normalised values."""
    n = len(degrees)
    degrees = degrees.astype(np.int64)
    indices = _distinct_columns(np.random.default_rng(seed), degrees, n)
    indptr = np.concatenate([[0], np.cumsum(degrees)])
    deg_in = np.bincount(indices, minlength=n)
    rows = np.repeat(np.arange(n), degrees)
    values = 1.0 / np.sqrt(np.maximum(degrees[rows], 1) * np.maximum(deg_in[indices], 1))
    return Csr(name, indptr.astype(np.int32), indices.astype(np.int32), values.astype(np.float32))


def uniform(n: int, degree: int, *, seed: int = 0) -> Csr:
    """Every row has exactly ``degree`` nonzeros."""
    return from_degrees(f"uniform-d{degree}-n{n}", np.full(n, degree), seed=seed)


def powerlaw(n: int, mean_degree: float, *, exponent: float = 2.1, max_degree: int | None = None,
             seed: int = 0) -> Csr:
    """Row degrees from a Pareto law ``P(d) ~ d^-exponent``, rounded and clipped to ``[1, max_degree]`` (default
    ``n // 50``), scaled so that their mean is ``mean_degree`` (to within 1%): a few hub rows hold many nonzeros."""
    cap = max_degree or max(n // 50, int(mean_degree))
    raw = np.random.default_rng([seed, 1]).pareto(exponent - 1, n) + 1.0
    lo, hi = 0.0, float(cap)
    for _ in range(60):  # the mean of the clipped degrees grows with the scale: bisect for the target
        scale = (lo + hi) / 2
        degrees = np.clip(np.round(raw * scale), 1, cap)
        if abs(degrees.mean() - mean_degree) < 0.01 * mean_degree:
            break
        lo, hi = (scale, hi) if degrees.mean() < mean_degree else (lo, scale)
    return from_degrees(f"powerlaw-d{mean_degree:g}-n{n}", degrees, seed=seed)


def spmm_graph(csr: Csr, feats: int) -> Graph:
    """``out = A @ dense``: one spmm node over this CSR's shapes (int32 indices, float32 values)."""
    b = GraphBuilder("spmm")
    indptr, indices = b.input("indptr", (csr.n + 1,), "int32"), b.input("indices", (csr.nnz,), "int32")
    values, dense = b.input("values", (csr.nnz,), "float32"), b.input("dense", (csr.n, feats), "float32")
    out = b.node("spmm", [indptr, indices, values, dense], (csr.n, feats), "float32", name="out", rows=csr.n)
    return b.build([out])


def spmm_inputs(csr: Csr, feats: int, *, seed: int = 0) -> dict[str, np.ndarray]:
    """The graph inputs by name: this CSR and standard-normal float32 features."""
    dense = np.random.default_rng([seed, 2]).standard_normal((csr.n, feats), dtype=np.float32)
    return {"indptr": csr.indptr, "indices": csr.indices, "values": csr.values, "dense": dense}


def reference(inputs: dict[str, np.ndarray]) -> np.ndarray:
    """``A @ dense`` in float64 (SciPy's CSR product)."""
    import scipy.sparse as sp

    n = len(inputs["indptr"]) - 1
    a = sp.csr_matrix((inputs["values"].astype(np.float64), inputs["indices"], inputs["indptr"]), shape=(n, n))
    return np.asarray(a @ inputs["dense"].astype(np.float64))


def spmm_task(csr: Csr, feats: int, *, seed: int = 0) -> tuple[Task, dict[str, np.ndarray]]:
    """The tunebank task of ``A @ dense`` on this CSR (its Problem holds these inputs and their float64
    reference), and the inputs by graph name (for timing other implementations on the same data)."""
    graph = spmm_graph(csr, feats)
    program = lower(graph)
    inputs = spmm_inputs(csr, feats, seed=seed)
    sig = signature(program, compute_dtype(program))
    problem = Problem({sig.names[n]: inputs[n] for n in program.inputs}, {sig.names["out"]: reference(inputs)},
                      tolerances(program, sig.names, inputs))
    return Task(csr.name, "sparse", graph, program, problem), inputs


@dataclass(frozen=True)
class SpmmCase:
    """One benchmark graph: how to make its CSR (made when benchmarked), and the feature width."""

    name: str
    make: Callable[[], Csr]
    feats: int

    @property
    def label(self) -> str:
        return f"{self.name}-f{self.feats}"


def spmm_cases(quick: bool) -> list[SpmmCase]:
    """The graph set: uniform degree 4 / 16 / 64 and heavy-tailed degrees, 10^5-10^6 rows, 64 or 128 features."""
    if quick:
        return [SpmmCase("uniform-d4-n4096", lambda: uniform(4096, 4), 32),
                SpmmCase("powerlaw-d8-n4096", lambda: powerlaw(4096, 8), 64)]
    return [
        SpmmCase("uniform-d4-n1000000", lambda: uniform(1_000_000, 4), 64),
        SpmmCase("uniform-d16-n500000", lambda: uniform(500_000, 16), 128),
        SpmmCase("uniform-d64-n200000", lambda: uniform(200_000, 64), 64),
        SpmmCase("uniform-d16-n100000", lambda: uniform(100_000, 16), 64),
        SpmmCase("powerlaw-d8-n1000000", lambda: powerlaw(1_000_000, 8), 64),
        SpmmCase("powerlaw-d32-n250000", lambda: powerlaw(250_000, 32), 128),
    ]
