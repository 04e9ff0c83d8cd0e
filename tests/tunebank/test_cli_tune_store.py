"""``tunebank tune`` stores what it measures (``--no-store`` keeps nothing): it shows in ``db stats``, and an
``optimize`` of the same model afterwards is all hits."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = "lm_head-h64-v256-t32"


def _cli(data_dir: Path, *args: str) -> str:
    env = {**os.environ, "TUNEBANK_DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, "-m", "tunebank", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=True).stdout


def test_tune_stores_every_measurement_and_optimize_then_hits_them(tmp_path: Path) -> None:
    rows = json.loads(_cli(tmp_path, "tune", MODEL, "--backend", "cpu", "--budget", "2", "--cpu-threads", "1",
                           "--json"))
    stats = json.loads(_cli(tmp_path, "db", "stats", "--json"))["tables"]
    assert stats["measurements"] == sum(r["evaluated"] for r in rows) > 0
    assert stats["baselines"] == stats["subgraphs"] == len(rows)
    report = json.loads(_cli(tmp_path, "optimize", MODEL, "--backend", "cpu", "--no-time", "--json"))
    assert {s["source"] for s in report["subgraphs"]} == {"hit"} and report["measured"] == 0


def test_no_store_keeps_nothing(tmp_path: Path) -> None:
    _cli(tmp_path, "tune", MODEL, "--backend", "cpu", "--budget", "1", "--no-store")
    assert not (tmp_path / "tunebank.db").exists()
