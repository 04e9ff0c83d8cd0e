"""``tunebank bench transfer --devices N``: the run's measurements in N processes, stage by stage, then the report
over the merged table; stopped at its time limit and resumed like a one-process run."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.service.conftest import transfer_cli
from tunebank.cli.bench_devices import device_environments

TINY = ["--models", "lm_head-h64-v256-t32,cnn_head-c32-i7-b1,lm_head-h64-v128-t32", "--budget", "2", "--k", "1",
        "--encoders", "static", "--repeats", "2", "--split", "family", "--cpu-threads", "1"]


def test_two_processes_measure_each_kernel_once_and_the_report_replays(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEBANK_DATA_DIR", str(tmp_path / "data"))
    app = transfer_cli()
    checkpoint, out = tmp_path / "partial.json", tmp_path / "r"
    run = [*TINY, "--devices", "2", "--checkpoint", str(checkpoint), "--out", str(out)]
    stopped = CliRunner().invoke(app, [*run, "--stop-after", "0.001"])
    assert stopped.exit_code == 3, stopped.output
    assert f"continue with --resume {checkpoint}" in stopped.output
    assert json.loads(checkpoint.read_text())["runs"][0]["kernels"] == 0
    guessed = CliRunner().invoke(app, [*TINY, "--replay", str(checkpoint), "--missing-as-failed", "--out",
                                       str(tmp_path / "g")])
    assert guessed.exit_code == 0, guessed.output
    assert (tmp_path / "g.md").read_text().startswith("**Provisional**: the ") and not (tmp_path / "g.json").exists()
    alone = CliRunner().invoke(app, [*TINY, "--missing-as-failed"])
    assert alone.exit_code == 2 and "--missing-as-failed is for --replay" in alone.output

    resumed = CliRunner().invoke(app, [*run, "--resume", str(checkpoint)])
    assert resumed.exit_code == 0, resumed.output
    assert "stage subgraphs: 2 shards done" in resumed.output and "stage folds: 2 shards done" in resumed.output
    report = json.loads(out.with_suffix(".json").read_text())
    measured = sum(len(recipes) for recipes in report["measurements"]["results"].values())
    # the shards measured everything (the command's own run over the merged table measured nothing), each once
    assert [r["kernels"] for r in report["runs"]] == [0, measured] == [0, report["kernels_run"]] and measured > 20

    replayed = CliRunner().invoke(app, [*TINY, "--replay", str(out.with_suffix(".json")), "--out", str(tmp_path / "p")])
    assert replayed.exit_code == 0, replayed.output
    live = out.with_suffix(".md").read_text()
    assert f"({measured} by this process)" in live  # the replay measured none: its report says 0, the rest is equal
    assert (tmp_path / "p.md").read_text() == live.replace(f"({measured} by this process)", "(0 by this process)")
    refused = CliRunner().invoke(app, [*TINY, "--replay", str(out.with_suffix(".json")), "--devices", "2"])
    assert refused.exit_code == 2 and "takes no --devices" in refused.output


def test_each_process_sees_one_of_the_visible_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert device_environments("cuda", 2) == [{"CUDA_VISIBLE_DEVICES": "2"}, {"CUDA_VISIBLE_DEVICES": "3"}]
    assert device_environments("cpu", 2) == [{}, {}]
    with pytest.raises(ValueError, match="--devices 3 needs as many GPUs; CUDA_VISIBLE_DEVICES shows 2"):
        device_environments("cuda", 3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert device_environments("cuda", 3)[2] == {"CUDA_VISIBLE_DEVICES": "2"}
