"""tune() end to end on the cpu backend, and the ``tunebank tune`` command."""

import json
import math
from pathlib import Path

import typer
from typer.testing import CliRunner

from embed.builder import GraphBuilder
from transforms.tune import tune
from tunebank.cli.tune import tune_command


def _graph():
    b = GraphBuilder("m")
    x, w = b.input("x", (8, 32), "float32"), b.param("w", (32, 16), "float32")
    y = b.node("matmul", [x, w], (8, 16), "float32")
    z = b.node("relu", [y], (8, 16), "float32")
    return b.build([b.node("softmax", [z], (8, 16), "float32", name="out", axis=-1)])


def test_tune_reports_each_subgraph(tmp_path: Path) -> None:
    seen = []
    results = tune(_graph(), strategy="random", budget=3, cache_dir=tmp_path, repeats=2,
                   progress=lambda task, done, total: seen.append((done, total)))
    assert [r.kind for r in results] == ["contraction", "reduction"]
    for r in results:
        assert r.evaluated == 4 and r.failed == 0 and r.space_size > 1000
        assert math.isfinite(r.default_s) and math.isfinite(r.best_s) and r.eager_s > 0
        assert r.best_recipe
    assert seen[-1] == (3, 3)


def test_cli_tune(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TUNEBANK_DATA_DIR", str(tmp_path))
    path = tmp_path / "g.json"
    path.write_text(_graph().model_dump_json())
    app = typer.Typer()
    app.command()(tune_command)
    runner = CliRunner()
    result = runner.invoke(app, [str(path), "--budget", "2", "--json", "--strategy", "evolutionary"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["kind"] for r in rows] == ["contraction", "reduction"] and all(r["evaluated"] == 3 for r in rows)
    bad = runner.invoke(app, [str(path), "--strategy", "nope"])
    assert bad.exit_code == 2 and "unknown strategy" in bad.output
