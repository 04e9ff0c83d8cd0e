"""``tunebank optimize`` as a user runs it: the report, the plan file, JSON, and Ctrl-C in the middle."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = "gpt_decoder-h64-s16-b1"
SMALL = "lm_head-h64-v256-t32"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tunebank", *args]


def _env(data_dir: Path) -> dict[str, str]:
    return {**os.environ, "TUNEBANK_DATA_DIR": str(data_dir), "COLUMNS": "80"}


def _measurements(db: Path) -> list[tuple[str, str]]:
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        try:
            return conn.execute("SELECT s.structural_hash, r.canonical FROM measurements m JOIN subgraphs s "
                                "ON s.id = m.subgraph_id JOIN recipes r ON r.id = m.recipe_id").fetchall()
        except sqlite3.OperationalError:  # the schema is not there yet
            return []


def test_ctrl_c_keeps_what_was_measured_and_the_rerun_measures_only_the_rest(tmp_path: Path) -> None:
    db = tmp_path / "tunebank.db"
    proc = subprocess.Popen(_cli("optimize", MODEL, "--backend", "cpu", "--k", "2", "--no-time"), cwd=ROOT,
                            env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len(_measurements(db)) < 4 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, "optimize ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    assert proc.returncode != 0
    kept = _measurements(db)
    assert len(kept) >= 4
    rerun = subprocess.run(_cli("optimize", MODEL, "--backend", "cpu", "--k", "2", "--no-time", "--json"), cwd=ROOT,
                           env=_env(tmp_path), capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(rerun.stdout)
    after = _measurements(db)
    assert set(kept) <= set(after) and len(after) == len(set(after))
    # every candidate of the rerun's transfers was measured once over both runs: what was kept is not run again
    transfers = {s["structural_hash"] for s in report["subgraphs"] if s["source"] == "transfer"}
    tried = sum(len(s["candidates"]) for s in report["subgraphs"] if s["source"] == "transfer")
    kept_there = sum(h in transfers for h, _ in kept)
    assert report["measured"] == tried - kept_there + report["folds_measured"]
    assert report["measured"] < tried or kept_there == 0
    again = subprocess.run(_cli("optimize", MODEL, "--backend", "cpu", "--k", "2", "--no-time", "--json"), cwd=ROOT,
                           env=_env(tmp_path), capture_output=True, text=True, timeout=300, check=True)
    third = json.loads(again.stdout)
    assert {s["source"] for s in third["subgraphs"]} <= {"hit", "bound"}  # every candidate is stored
    assert third["measured"] == 0  # so is every fold
    timed = [a for a in third["attentions"] if a["apart_s"] is not None]
    assert timed and all(a["stored"] for a in timed)  # and the fused attention's trial: it decides as before
    assert [a["choice"] for a in third["attentions"]] == [a["choice"] for a in report["attentions"]]


def test_optimize_writes_a_plan_and_strict_json(tmp_path: Path) -> None:
    plan = tmp_path / "m.tbplan"
    done = subprocess.run(_cli("optimize", SMALL, "--backend", "cpu", "--k", "1", "--out", str(plan), "--json"),
                          cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(done.stdout, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert report["plan"] == str(plan) and plan.is_file()
    assert report["model_s"] is not None and report["eager_model_s"] is not None
    table = subprocess.run(_cli("optimize", SMALL, "--backend", "cpu", "--k", "1", "--no-time"), cwd=ROOT,
                           env=_env(tmp_path), capture_output=True, text=True, timeout=300, check=True).stdout
    # a table row starts with its subgraph number (a wrapped device name such as "2.80GHz" does not)
    rows = [words for words in map(str.split, table.splitlines()) if words and words[0].isdigit()]
    assert rows and {r[2] for r in rows} == {"hit"}, table
    assert max(len(line) for line in table.splitlines()) <= 80


def test_a_bad_model_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    done = subprocess.run(_cli("optimize", str(bad), "--backend", "cpu"), cwd=ROOT, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert not _measurements(tmp_path / "tunebank.db")


def test_an_onnx_export_optimizes_into_a_plan_that_runs_with_the_files_own_weights(tmp_path: Path) -> None:
    import torch

    import tunebank
    from tests.tunebank.test_api import Block
    from tunebank.settings import Settings

    torch.manual_seed(3)
    module, x = Block().eval(), torch.randn(8, 32)
    torch.onnx.export(module, (x,), str(tmp_path / "block.onnx"))  # torch 2.13: weights as external data beside it
    plan = tmp_path / "block.tbplan"
    subprocess.run(_cli("optimize", str(tmp_path / "block.onnx"), "--backend", "cpu", "--k", "1", "--no-time",
                        "--margin", "0", "--out", str(plan)), cwd=ROOT, env=_env(tmp_path), capture_output=True,
                   timeout=300, check=True)
    loaded = tunebank.load(plan, settings=Settings(data_dir=tmp_path))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), module(x), rtol=1e-4, atol=1e-5)


def test_the_table_counts_candidates_not_run_apart_from_failures(capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from service.optimize_report import OptimizeReport, SubgraphReport
    from tunebank.cli import optimize
    from tunebank.cli.optimize import _print

    monkeypatch.setattr(optimize, "console", Console(width=200, highlight=False))  # whatever the terminal's width

    errors = [None, "wrong", "slow", "slow", None]
    row = SubgraphReport("conv", "reduction", "h" * 64, ["conv2d"], 1, "transfer", eager_s=1e-5,
                         candidates=[{"recipe": f"r{n}", "origin": "random", "seconds": None, "error": e,
                                      "message": None} for n, e in enumerate(errors)],
                         neighbours=[{"structural_hash": "n" * 64, "distance": 0.5, "recipe": "r0",
                                      "lent_by": "cuda:NVIDIA H100 80GB HBM3"}])
    fewer = SubgraphReport("add", "elementwise", "a" * 64, ["add"], 1, "transfer", eager_s=1e-6,
                           reason="1.0% of the model's eager time: its default recipe, the library calls and one "
                                  "neighbour's")
    _print(OptimizeReport("m", "cuda", "cuda:NVIDIA H200", "nvrtc", subgraphs=[row, fewer]))
    out = capsys.readouterr().out
    assert "3/1x+2" in out  # 3 run, 1 of them failed, 2 not run
    assert "neighbours' recipes measured on cuda:NVIDIA H100 80GB HBM3" in out
    assert "#1 1.0% of the model's eager time" in out and "#0 " not in out  # why a transfer tried fewer


def test_each_way_the_model_was_timed_whole_is_shown_when_there_were_several(capsys: pytest.CaptureFixture[str],
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from service.optimize_report import OptimizeReport
    from tunebank.cli import optimize
    from tunebank.cli.optimize import _print
    from tunebank.reports import Report

    monkeypatch.setattr(optimize, "console", Console(width=200, highlight=False))
    ways = {"plan": 8.2e-4, "plan with tied kernels": 7.97e-4}
    local = OptimizeReport("m", "cuda", "cuda:NVIDIA H200", "nvrtc", model_s=7.97e-4, eager_model_s=9e-4, ways_s=ways)
    for report in (local, Report.from_json(local.to_json())):  # optimized here, or by a server
        _print(report)
        assert "timed whole: plan 0.820 ms, plan with tied kernels 0.797 ms" in capsys.readouterr().out
    _print(OptimizeReport("m", "cpu", "cpu", "gcc", model_s=1e-3, eager_model_s=2e-3, ways_s={"plan": 1e-3}))
    assert "timed whole" not in capsys.readouterr().out  # one way: the whole-model line says it all
