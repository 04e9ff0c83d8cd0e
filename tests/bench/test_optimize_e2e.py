"""``bench.optimize_e2e`` without a GPU: checkpoint and resume, the deadline watchdog, the report, input copies,
the error measure; and every held-out model of ``bench.e2e_models`` imports and none is in the recording."""

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import e2e_models
from bench import optimize_e2e as e2e


def _fake_columns(calls: list[tuple[str, str]], ms: dict[str, float]) -> dict[str, Any]:
    def make(col: str) -> Any:
        def fn(module: Any, inputs: tuple[Any, ...]) -> dict[str, Any]:
            calls.append((module, col))
            if col == "broken":
                raise RuntimeError("no kernel")
            return {"ms": ms[col] * module_scale[module], "compile_s": None if col == "eager" else 2.5,
                    "max_rel_err": 1e-7}
        return fn
    module_scale = {"a": 1.0, "b": 2.0, "c": 4.0}
    return {c: make(c) for c in ("eager", "fast", "broken")}


def _run(ckpt: e2e.Checkpoint, models: list[str], cols: list[str], columns: dict[str, Any]) -> int:
    pairs = e2e.todo(ckpt, models, cols)
    return e2e.run(ckpt, pairs, build=lambda m: (m, ()), columns=columns, env={"device": "fake"}, log=lambda _: None)


def test_resume_measures_only_what_is_missing(tmp_path: Path) -> None:
    calls: list[tuple[str, str]] = []
    columns = _fake_columns(calls, {"eager": 1.0, "fast": 0.5, "broken": 1.0})
    path = tmp_path / "r.json"
    assert _run(e2e.Checkpoint(path), ["a", "b"], ["eager"], columns) == 0
    assert calls == [("a", "eager"), ("b", "eager")]
    saved = json.loads(path.read_text())
    assert saved["results"]["b"]["eager"]["status"] == "ok" and saved["results"]["b"]["eager"]["ms"] == 2.0

    calls.clear()
    ckpt = e2e.Checkpoint(tmp_path / "r2.json", e2e.Checkpoint.load(path))
    assert e2e.todo(ckpt, ["a", "b", "c"], ["eager", "fast"]) == [("a", "fast"), ("b", "fast"), ("c", "eager"),
                                                                  ("c", "fast")]
    _run(ckpt, ["a", "b", "c"], ["eager", "fast", "broken"], columns)
    assert calls == [("a", "fast"), ("a", "broken"), ("b", "fast"), ("b", "broken"), ("c", "eager"), ("c", "fast"),
                     ("c", "broken")]
    again = e2e.Checkpoint.load(tmp_path / "r2.json")
    assert again["results"]["a"]["eager"] == saved["results"]["a"]["eager"]  # kept, not re-measured
    assert again["results"]["c"]["broken"]["status"] == "error" and "no kernel" in again["results"]["c"]["broken"][
        "error"]
    ckpt = e2e.Checkpoint(None, again)
    assert e2e.todo(ckpt, ["a", "b", "c"], ["eager", "fast", "broken"]) == []
    assert len(e2e.todo(ckpt, ["a", "b", "c"], ["broken"], retry_errors=True)) == 3


def test_running_marker_becomes_unfinished_and_is_kept() -> None:
    data = {"schema": e2e.SCHEMA, "runs": [], "results": {"a": {"eager": {"status": "running", "started": "t"}}}}
    ckpt = e2e.Checkpoint(None, data)
    ckpt.mark_running_as_unfinished("killed")
    assert ckpt.entry("a", "eager") == {"status": "unfinished", "started": "t", "note": "killed"}
    assert e2e.todo(ckpt, ["a"], ["eager"]) == []
    assert e2e.todo(ckpt, ["a"], ["eager"], retry_unfinished=True) == [("a", "eager")]


def test_merge_keeps_each_pairs_latest_entry_and_each_run_once() -> None:
    base_run = {"date": "2026-01-01T00:00:00Z", "command": "base"}
    base = {"schema": e2e.SCHEMA, "runs": [base_run], "results": {
        "a": {"eager": {"status": "ok", "ms": 1.0, "started": "2026-01-01T00:00:01Z"},
              "slow": {"status": "unfinished", "started": "2026-01-01T00:00:02Z"}},
        "b": {"eager": {"status": "ok", "ms": 2.0, "started": "2026-01-01T00:00:03Z"}}}}
    shard_a = json.loads(json.dumps(base))  # each shard resumed the base, then measured its own model
    shard_a["runs"].append({"date": "2026-01-02T00:00:00Z", "command": "shard a"})
    shard_a["results"]["a"]["slow"] = {"status": "ok", "ms": 0.5, "started": "2026-01-02T00:00:05Z"}
    shard_b = json.loads(json.dumps(base))
    shard_b["runs"].append({"date": "2026-01-02T00:00:00Z", "command": "shard b"})
    shard_b["results"]["b"]["slow"] = {"status": "unfinished", "started": "2026-01-02T00:00:07Z"}
    for order in ([base, shard_a, shard_b], [shard_b, shard_a, base]):
        merged = e2e.merge(order)
        assert merged["results"]["a"]["slow"] == {"status": "ok", "ms": 0.5, "started": "2026-01-02T00:00:05Z"}
        assert merged["results"]["b"]["slow"]["status"] == "unfinished"
        assert merged["results"]["a"]["eager"]["ms"] == 1.0 and merged["results"]["b"]["eager"]["ms"] == 2.0
        assert [r["command"] for r in merged["runs"]] in (["base", "shard a", "shard b"],
                                                          ["base", "shard b", "shard a"])


def test_deadline_watchdog_writes_unfinished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snapshots: list[dict[str, Any]] = []
    path = tmp_path / "w.json"

    def fake_exit(code: int) -> None:
        snapshots.append(json.loads(path.read_text()))
        released.set()

    released = threading.Event()
    monkeypatch.setattr(e2e.os, "_exit", fake_exit)
    ckpt = e2e.Checkpoint(path)
    e2e.run(ckpt, [("a", "slow")], build=lambda m: (m, ()), columns={"slow": lambda m, i: released.wait(10) and {
        "ms": 1.0}}, env={"device": "fake"}, deadline_s=0.2, log=lambda _: None)
    entry = snapshots[0]["results"]["a"]["slow"]
    assert entry["status"] == "unfinished" and entry["seconds"] >= 0 and "deadline" in entry["note"]


def test_report_table_speedups_and_missing() -> None:
    data = {"schema": e2e.SCHEMA, "runs": [{"date": "2026-11-24T23:00:00Z", "commit": "abc1234", "columns": ["eager"],
                                            "env": {"device": "NVIDIA H200", "torch": "2.11.0"}, "command": "x"}],
            "results": {
                "m1": {"eager": {"status": "ok", "ms": 2.0},
                       "default": {"status": "ok", "ms": 1.0, "compile_s": 3.25, "max_rel_err": 2e-7},
                       "max-autotune": {"status": "unfinished", "seconds": 512.3, "note": "deadline"}},
                "m2": {"eager": {"status": "ok", "ms": 1.0},
                       "default": {"status": "ok", "ms": 2.0, "compile_s": 1.0, "max_rel_err": 0.0},
                       "max-autotune": {"status": "error", "error": "boom"}},
                "m3": {"eager": {"status": "ok", "ms": 1.0},
                       "default": {"status": "ok", "ms": 1.0, "eager_ms": 3.0}},  # eager timed in turn: 3 ms
            }}
    text = e2e.report(data, origin=lambda m: "new")
    rows = [line for line in text.splitlines() if line.startswith(("| m1 ", "| m2 "))]
    assert rows[0].split(" | ")[:6] == ["| m1", "new", "2", "1 (2.00x)", "3.2", "2.0e-07"]
    assert "unfinished (>512 s)" in rows[0] and "error" in rows[1] and "0.50x" in rows[1]
    assert "| m3 | new | 1 | 1 (3.00x) |" in text
    assert "geomean speedup over eager 1.44x over 3 models (min 0.50x, max 3.00x)" in text
    assert "NVIDIA H200" in text and "abc1234" in text and "m2 / max-autotune: error: boom" in text
    assert "m3 / max-autotune: not run" in text
    assert text.index("default ms") < text.index("max-autotune ms")  # COLUMNS order
    assert "by ms" not in text  # no tunebank column


def test_report_names_the_plans_that_ran_without_their_cuda_graph() -> None:
    ok = {"status": "ok", "ms": 1.0, "eager_ms": 2.0}
    data = {"schema": e2e.SCHEMA, "runs": [],
            "results": {"swin": {"tunebank": {**ok, "graph_lost": True}, "tunebank-warm": {**ok, "graph_lost": False}},
                        "bert": {"tunebank": ok}}}
    assert "without their plan's CUDA graph (a capture failed): swin / tunebank\n" in e2e.report(data)
    del data["results"]["swin"]
    assert "CUDA graph" not in e2e.report(data)


def test_report_compares_tunebank_with_the_other_columns_by_absolute_time() -> None:
    def ok(ms: float, eager_ms: float) -> dict[str, Any]:
        return {"status": "ok", "ms": ms, "eager_ms": eager_ms}

    data = {"schema": e2e.SCHEMA, "runs": [], "results": {
        "m1": {"default": ok(2.0, 4.0), "max-autotune": ok(1.0, 9.0), "tunebank": ok(1.0, 4.0)},
        "m2": {"default": ok(1.0, 1.0), "max-autotune": ok(4.0, 5.0), "tunebank": ok(2.0, 1.0)},
        "m3": {"default": ok(3.0, 3.0), "max-autotune": {"status": "error", "error": "x"}, "tunebank": ok(1.5, 3.0)}}}
    text = e2e.report(data)
    # default / tunebank: 2, 0.5, 2 -> geomean 2**(1/3); max-autotune / tunebank: 1, 2 (m3 did not run) -> sqrt(2)
    assert "tunebank over default by ms: geomean 1.26x over 3 models (min 0.50x, max 2.00x)" in text
    assert "tunebank over max-autotune by ms: geomean 1.41x over 2 models (min 1.00x, max 2.00x)" in text


def test_report_compares_tunebank_with_each_models_fastest_other_column_of_several_calls() -> None:
    def ok(ms: float) -> dict[str, Any]:
        return {"status": "ok", "ms": ms, "device": "NVIDIA H200"}

    data = {"schema": e2e.SCHEMA, "runs": [], "results": {
        "m1": {"default": ok(4.0), "tunebank": ok(1.0)},  # this call's default was slowed: 2.0 elsewhere
        "m2": {"default": ok(1.0), "tunebank": ok(2.0)}}}
    other = {"schema": e2e.SCHEMA, "runs": [], "results": {
        "m1": {"default": ok(2.0)}, "m2": {"default": ok(1.5), "max-autotune": ok(1.0)},
        "m3": {"default": ok(0.5)}}}  # a model the reported call lacks counts for nothing
    text = e2e.report(data, fastest_of=[other])
    # fastest default / tunebank: m1 2.0 / 1.0, m2 1.0 / 2.0 -> geomean 1.0 (this call alone: 4 and 0.5 -> 1.41)
    assert ("tunebank over default by ms, each model's fastest default of 2 checkpoints: geomean 1.000x over 2 "
            "models (min 0.50x, max 2.00x); below 1x: m2 0.50x") in text
    assert "tunebank over default by ms: geomean 1.41x" in text
    # a column only another call ran counts where it ran: m2's max-autotune 1.0 / 2.0
    assert ("tunebank over max-autotune by ms, each model's fastest max-autotune of 2 checkpoints: geomean 0.500x "
            "over 1 models") in text
    elsewhere = {"schema": e2e.SCHEMA, "runs": [], "results": {"m1": {"default": {**ok(1.0), "device": "H100"}}}}
    with pytest.raises(SystemExit, match="mixes devices"):
        e2e.report(data, fastest_of=[elsewhere])


def test_input_copies_and_error_measure() -> None:
    x, idx = torch.randn(4, 8), torch.randint(0, 5, (4,))
    sets = e2e.input_sets((x, idx), copies=3)
    assert len(sets) == 3 and sets[0][0] is x
    for s in sets[1:]:
        assert not torch.equal(s[0], x) and bool((s[0] != 0).all()) and s[1] is idx
        ratio = s[0] / x
        assert float(ratio.min()) >= 0.5 and float(ratio.max()) <= 1.5
    assert len(e2e.input_sets((torch.randn(4),))) == 16  # tiny inputs: the most copies
    assert len(e2e.input_sets((torch.empty(2 * e2e.L2_BYTES // 4),))) == 2
    ref = torch.tensor([1.0, -4.0])
    assert e2e.max_rel_err(torch.tensor([1.0, -3.0]), ref) == pytest.approx(0.25)
    assert e2e.max_rel_err((ref, ref), (ref, ref)) == 0.0
    assert math.isinf(e2e.max_rel_err(torch.tensor([float("nan"), 0.0]), ref))
    assert math.isinf(e2e.max_rel_err(torch.zeros(3), ref))


def test_measure_times_and_checks_a_module() -> None:
    module = torch.nn.Linear(8, 4).eval()
    inputs = (torch.randn(16, 8),)
    out = e2e.measure(module, module, inputs, compile_s=1.5)
    assert out["max_rel_err"] == 0.0 and out["ms"] > 0 and out["calls"] >= 50 and out["compile_s"] == 1.5
    assert "eager_ms" not in out  # eager is not paired with itself
    wrong = e2e.measure(lambda x: module(x) * 1.01, module, inputs)
    assert wrong["max_rel_err"] == pytest.approx(0.01, rel=1e-3)


def test_a_column_is_timed_in_turn_with_eager_so_a_drifting_host_moves_both() -> None:
    ticks = iter(range(10**6))

    def drifting(x: torch.Tensor) -> torch.Tensor:  # each call slower than the one before, whoever makes it
        time.sleep(1e-4 * (1 + next(ticks) / 50))
        return x

    out = e2e.time_calls(drifting, [(torch.ones(1),)], reference=drifting, min_calls=100, max_calls=100)
    # timed after eager instead of in turn, the column would be ~1.5x slower than the same function as eager
    assert out["ms"] / out["eager_ms"] == pytest.approx(1.0, abs=0.12)


def test_models_are_held_out_and_import() -> None:
    from embed.importers.torch_importer import import_module
    from embed.partition import partition

    assert len(e2e_models.MODELS) >= 10 and len(set(e2e_models.MODELS)) == len(e2e_models.MODELS)
    assert not set(e2e_models.MODELS) & set(e2e_models.RECORDED)
    families = {m.partition("-")[0] for m in e2e_models.MODELS}
    assert len(families) == len(e2e_models.MODELS)
    assert sum(e2e_models.is_new(m) for m in e2e_models.MODELS) >= 5
    for name in e2e_models.MODELS:
        module, inputs = e2e_models.build(name, "meta")
        assert not module.training
        kinds = {str(s.kind) for s in partition(import_module(module, inputs, name=name))}
        assert "opaque" not in kinds, name


def test_new_families_run_on_cpu_at_small_sizes() -> None:
    small = ["t5_block-h64-s8-b2", "mobilenet_block-c8-i8-b2", "tabular_mlp-f4-h16-b8", "dense_gcn-n16-f8",
             "swin_block-c32-i14-w7-b1", "cross_attn_block-h64-q4-k8-b2", "resmlp_block-h16-s8-b2"]
    assert {m.partition("-")[0] for m in small} == set(e2e_models.NEW_FAMILIES)
    for name in small:
        module, inputs = e2e_models.build(name, "cpu")
        again, inputs2 = e2e_models.build(name, "cpu")
        with torch.no_grad():
            out = module(*inputs)
            assert torch.isfinite(out).all() and torch.equal(out, again(*inputs2)), name  # seeded


def test_the_rows_keep_each_candidates_time_or_error() -> None:
    from bench.optimize_e2e import _subgraph_rows

    row = {"ops": ["conv2d", "relu"], "structural_hash": "h", "source": "transfer", "choice": "kernel",
           "recipe": "conv(torch)", "kernel_s": 1e-5, "eager_s": 2e-5,
           "candidates": [{"origin": "library", "recipe": "conv(torch)", "seconds": 1e-5, "error": None},
                          {"origin": "random", "recipe": "fuse(none)", "seconds": None, "error": "slow"}],
           "neighbours": [{"structural_hash": "n", "distance": 0.5, "recipe": "conv(torch)", "lent_by": "NVIDIA H100"},
                          {"structural_hash": "m", "distance": 0.7, "recipe": "conv(torch)", "lent_by": None}]}
    (out,) = _subgraph_rows({"subgraphs": [row]})
    assert out["ops"] == "conv2d+relu" and out["recipe"] == "conv(torch)" and out["tried"] == 2
    assert out["candidates"] == [["library", "conv(torch)", 1e-5], ["random", "fuse(none)", "slow"]]
    assert out["neighbours"] == [["n", 0.5, "NVIDIA H100"], ["m", 0.7, None]]
