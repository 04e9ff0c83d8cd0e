"""A model exported with torch's default ``torch.onnx.export`` (weights as external data beside it) inspects and
tunes on cpu."""

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from tunebank.cli import app

runner = CliRunner()


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(64, 128), nn.Linear(128, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("export") / "mlp.onnx"
    with contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(_Mlp(), (torch.randn(8, 64),), path)  # the defaults: dynamo, external data
    assert (path.parent / "mlp.onnx.data").stat().st_size >= 64 * 128 * 4  # the weights are outside the file
    return path


def test_default_torch_export_inspects(exported: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["inspect", str(exported), "--json", str(tmp_path / "ir.json")])
    assert result.exit_code == 0, result.output
    kinds = [s["kind"] for s in json.loads((tmp_path / "ir.json").read_text())["subgraphs"]]
    assert kinds.count("contraction") == 2


def test_default_torch_export_tunes_on_cpu(exported: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["tune", str(exported), "--backend", "cpu", "--strategy", "random", "--budget", "2",
                                 "--json"], env={"TUNEBANK_DATA_DIR": str(tmp_path)})
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 2 and all(r["best_s"] > 0 and r["failed"] == 0 for r in rows)
