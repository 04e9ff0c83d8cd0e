"""``bench.gpu_table`` without a GPU: arguments, case selection, prior recipes, the tuning and transfer steps on
the cpu backend, and the report's ratios."""

import json
import math
from pathlib import Path

import pytest

from bench.gpu_table import SPMM, head_to_head, parse_args, prior_recipes, selected, transfer, tune, with_new_knobs
from bench.gpu_table_report import markdown
from bench.gpu_transforms import layernorm
from bench.spmm_graphs import powerlaw, spmm_task
from db.migrate import upgrade
from db.session import Database
from embed import zoo
from embed.partition import partition
from service.crawl import crawl
from tests.service.conftest import TINY_MODELS, synthetic_measurer
from transforms.recipe import parse
from transforms.run import Worker
from transforms.space import RecipeSpace, default_recipe
from transforms.tune import evaluator, make_task

ROOT = Path(__file__).resolve().parents[2]


def test_arguments_and_selection() -> None:
    args = parse_args(["--out", "x"])
    assert (args.budget, args.spmm_budget, args.db, args.modes) == (3, 8, None, "default,max-autotune")
    dense, sparse = selected(args)
    assert len(dense) == 21 and SPMM not in {c.family for c in dense} and len(sparse) == 6
    dense, sparse = selected(parse_args(["--out", "x", "--only", SPMM]))
    assert dense == [] and len(sparse) == 6
    dense, sparse = selected(parse_args(["--out", "x", "--only", "softmax,layernorm", "--sizes", "8192x4096"]))
    assert [(c.family, c.size) for c in dense] == [("softmax", "8192x4096"), ("layernorm", "8192x4096")]
    assert sparse == []
    dense, sparse = selected(parse_args(["--out", "x", "--quick", "--sizes", "powerlaw-d8-n4096-f64"]))
    assert dense == [] and [g.label for g in sparse] == ["powerlaw-d8-n4096-f64"]
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--modes", "default,reduce-overhead"])


def test_prior_recipes_from_both_json_layouts(tmp_path: Path) -> None:
    committed = prior_recipes(ROOT / "bench/results/gpu_transforms_h200.json")
    assert committed[("matmul+bias+gelu", "4096x768x3072")] == "gemm(cublaslt,0)"
    ours = tmp_path / "table.json"
    ours.write_text(json.dumps({"rows": [{"family": "softmax", "size": "1x2", "tunebank": {"best_recipe": "x"}},
                                         {"family": "softmax", "size": "3x4", "error": "boom"}]}))
    assert prior_recipes(ours) == {("softmax", "1x2"): "x"} and prior_recipes(None) == {}


def test_tune_random_then_seeded_on_a_custom_csr(tmp_path: Path) -> None:
    task, _ = spmm_task(powerlaw(500, 6, max_degree=100, seed=1), 8)
    with Worker() as worker:
        evaluate = evaluator(task, backend="cpu", cache_dir=tmp_path, worker=worker, repeats=1, jobs=2)
        first = tune(task, evaluate, budget=2, backend="cpu")
        seeded = tune(task, evaluate, budget=2, backend="cpu", seeds=[first["best_recipe"], "sparse(ell,4)"])
    assert first["strategy"] == "random" and first["evaluated"] == 3 and math.isfinite(first["best_s"])
    assert first["failed"] == 0 and first["best_rel_err"] <= 1e-4
    assert seeded["strategy"] == "seeded" and 1 <= seeded["seeds"] <= 2
    assert seeded["evaluated"] == 1 + seeded["seeds"] + 2 and math.isfinite(seeded["best_s"])


def test_transfer_from_a_crawled_database(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'tunebank.db'}")
    graph = layernorm(64, 256).graph
    kwargs = {"database": database, "measurer": synthetic_measurer(), "index_dir": tmp_path / "index", "k": 2,
              "encoder": "static", "backend": "cpu"}
    assert "schema" in transfer(graph, **kwargs)["error"]
    upgrade(database.engine)
    subgraphs = [s for name in TINY_MODELS for s in partition(zoo.load(name)) if s.tunable]
    crawl(database, subgraphs, synthetic_measurer(), backend="cpu", budget=4)
    result = transfer(graph, **kwargs)
    assert "error" not in result, result
    assert result["subgraphs"] == 1 and result["evaluations"] >= 1 and result["s"] > 0 and result["wall_s"] > 0
    assert 1 <= len(result["neighbours"][0]) <= 2


def test_a_prior_recipe_is_retried_with_the_knobs_it_predates() -> None:
    space = RecipeSpace(make_task(layernorm(64, 768).graph).program, "cuda")
    old = ";".join(s for s in str(space.default).split(";") if not s.startswith("cache_hint("))
    seeds = with_new_knobs(old, space)
    assert seeds[0] == old and [space.legal(parse(s)) for s in seeds[1:]] == [
        space.legal(parse(f"{old};cache_hint(stream)"))]
    assert with_new_knobs(str(space.default), space) == [str(space.default)]


def test_head_to_head_times_both_winners_in_one_call(tmp_path: Path) -> None:
    task = make_task(layernorm(64, 256).graph)
    default = str(default_recipe(task.program, "cpu"))
    other = default.replace("vectorize(8)", "vectorize(1)") if "vectorize(8)" in default else default
    with Worker() as worker:
        evaluate = evaluator(task, backend="cpu", cache_dir=tmp_path, worker=worker, repeats=3)
        both = head_to_head(task, evaluate, {"best_recipe": default}, {"winners": [other]}, rounds=2)
    assert both["tuned_s"] > 0 and both["transfer_s"] > 0 and both["same_recipe"] == (other == default)
    assert "error" in head_to_head(task, evaluate, {"best_recipe": default}, {"winners": []})


def _spmm_row(name: str, cupyx_s: float, tuned_s: float) -> dict:
    return {"family": SPMM, "size": name, "n": 10, "nnz": 40, "deg_mean": 4.0, "deg_max": 4, "deg_cv": 0.0,
            "bound_s": tuned_s / 2, "eager": {"s": 1.0, "captured": False}, "cupyx csr@dense": {"s": cupyx_s},
            "torch.sparse": {"error": "nope"}, "cusparse spmm (col-major B)": {"s": cupyx_s / 2},
            "tunebank": {"default_s": 1.0, "best_s": tuned_s, "best_recipe": "r", "strategy": "random", "seeds": 0,
                         "evaluated": 3, "failed": 0, "search_s": 1.0}}


def test_report_ratios_and_geomeans() -> None:
    meta = {"device": "GPU", "l2_mb": 60.0, "date": "today", "torch": "t", "triton": "tr", "cupy": "c",
            "copy_tbps": 4.0, "matmul_tflops": 800.0, "inductor_startup_s": 3.0, "args": {"budget": "6"}}
    text = markdown(meta, [_spmm_row("a", 4e-3, 1e-3), _spmm_row("b", 1e-3, 1e-3),
                           {"family": SPMM, "size": "c", "error": "out of memory"}])
    assert "over cupyx csr@dense 2.00x (2 of 2), over the cuSPARSE SpMM call alone (column-major B) 1.00x" in text
    assert "over torch.sparse (cuSPARSE SpMM on row-major B) - (0 of 2)" in text
    assert "fastest correct library per graph 1.00x (2 of 2)" in text  # a: 2e-3 / 1e-3, b: 5e-4 / 1e-3
    assert "| a | 10 | 40 | 4.0 / 4 / 0.00 | 0.5000 | 1000.0000 (2000.00) † |" in text
    assert "| 4.00 | 2.00 |" in text  # a: cupyx / tunebank, best library / tunebank
    assert "| c | failed: out of memory" in text and "## Dense families" not in text
    wrong = _spmm_row("w", 4e-3, 1e-3)
    wrong["cupyx csr@dense"]["rel_err"] = 1.0
    text = markdown(meta, [wrong, _spmm_row("b", 1e-3, 1e-3)])
    assert "over cupyx csr@dense 1.00x (1 of 2)" in text and "wrong result (rel err 1; 4.0000)" in text
    dense = {"family": "softmax", "size": "8x8", "bytes": 70e6, "flops": 0, "bound_s": 1e-3,
             "eager": {"s": 2e-3, "captured": True},
             "compile default": {"compile_s": 1.5, "s": 1.5e-3, "captured": True},
             "compile max-autotune": {"compile_s": 9.0, "s": 1.2e-3, "captured": True},
             "transfer": {"error": "no --db given"},
             "tunebank": {"default_s": 2e-3, "best_s": 1e-3, "best_recipe": "r", "strategy": "seeded", "seeds": 1,
                          "evaluated": 8, "failed": 0, "search_s": 2.0}}
    text = markdown(meta, [dense])
    assert "tunebank tuned is 2.00x eager and 1.20x torch.compile max-autotune" in text
    assert "default 1.5 s, max-autotune 9.0 s" in text
    assert "| 1.2000 (1.20) | 1.0000 (1.00) | 1.20 | 1.5, 9.0 | seeded 1+local, 8 cands" in text
    assert "no --db given" in text and "## SpMM" not in text
    assert "moving more than L2 (1): tuned / bound geomean 1.000; slowest against max-autotune 1.20" in text
    small = dict(dense, size="4x4", bytes=1e6, transfer={"s": 1.1e-3, "wall_s": 0.5},
                 head_to_head={"tuned_s": 1e-3, "transfer_s": 1.04e-3, "same_recipe": True})
    text = markdown(meta, [dense, small])
    assert "moving more than L2 (1)" in text and "within 5% of tuned (side by side) in 1 of 1 cases" in text
    assert "under 1 s in 1 of 1" in text and "0.91 of tuned; side by side 0.96, same recipe |" in text
