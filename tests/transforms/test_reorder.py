"""``transforms.reorder``: A·(X·W) -> (A·X)·W is exact, partitions as expected, and tune compares the orders."""

import json
import math
from pathlib import Path

import numpy as np
import torch
from typer import Typer
from typer.testing import CliRunner

from embed import zoo
from embed.eager import run_eager
from embed.inputs import random_inputs
from embed.partition import partition
from transforms.reorder import chain_orders, chains
from transforms.tune import tune
from tunebank.cli.tune import tune_command

MODEL = "gcn-n64-f16-d0.05"


def test_reordered_gcn_is_exact_in_float64() -> None:
    graph = zoo.load(MODEL)
    graphs = chain_orders(graph)
    assert len(graphs) == 3 and graphs[0] is graph
    inputs = {k: torch.as_tensor(v) for k, v in random_inputs(graph, seed=0).items()}
    reference = run_eager(graph, inputs, compute_dtype=torch.float64)["t6"].numpy()
    for other in graphs[1:]:
        out = run_eager(other, inputs, compute_dtype=torch.float64)["t6"].numpy()
        assert out.shape == reference.shape and other.outputs == graph.outputs
        np.testing.assert_allclose(out, reference, rtol=0, atol=1e-9)
        assert chains(other) != chains(graph)  # the rewritten chain is gone


def test_rewritten_graph_partitions_into_spmm_then_matmul() -> None:
    first = chain_orders(zoo.load(MODEL))[1]
    kinds = [(s.kind.value, s.ops) for s in partition(first)][:2]
    assert kinds == [("sparse", ["spmm"]), ("contraction", ["matmul", "relu"])]
    assert [n.op for n in first.nodes][:2] == ["spmm", "matmul"]


def test_no_chain_without_a_weight() -> None:
    graph = zoo.load("mixer_block-h32-s16-b1")
    assert chain_orders(graph) == [graph]


def test_tune_reports_both_orders(tmp_path: Path) -> None:
    results = tune(zoo.load(MODEL), budget=1, cache_dir=tmp_path, repeats=1, reorder=True)
    assert len(results.orders) == 2
    assert all(math.isfinite(o.original_s) and math.isfinite(o.reordered_s) for o in results.orders)
    assert all(o.winner in ("A·(X·W)", "(A·X)·W") for o in results.orders)
    assert {r.name.split(" ")[1] for r in results} >= {"(spmm)", "(matmul+relu)", "(spmm+relu)", "(matmul)"}
    assert tune(zoo.load(MODEL), budget=1, cache_dir=tmp_path, repeats=1).orders == []


def test_cli_reorder_prints_the_orders(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TUNEBANK_DATA_DIR", str(tmp_path))
    app = Typer()
    app.command()(tune_command)
    result = CliRunner().invoke(app, [MODEL, "--backend", "cpu", "--budget", "1", "--reorder", "--json"])
    assert result.exit_code == 0, result.output
    orders = json.loads(result.output)["orders"]
    assert [o["winner"] in ("A·(X·W)", "(A·X)·W") for o in orders] == [True, True]
