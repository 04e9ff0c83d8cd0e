"""``tunebank optimize MODEL --server URL`` against a live ``tunebank serve`` (the ``server`` fixture of conftest.py,
on SQLite, with a small model limit): the local report table, the plan file, JSON, and one ``error:`` line with exit
2 for a server that is not there, a missing, unknown or read-only key, and a model over the server's limit."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

import tunebank
from embed import zoo
from tests.tunebank.conftest import free_port
from tunebank.cli import app
from tunebank.cli import optimize as cli_optimize

MODEL = "lm_head-h64-v256-t32"
runner = CliRunner()


@pytest.fixture(scope="module")
def database_env() -> Iterator[dict[str, str]]:
    yield {}  # SQLite: the client's own tests cover PostgreSQL


@pytest.fixture(scope="module")
def server_settings() -> dict[str, str]:
    return {"TUNEBANK_MAX_MODEL_BYTES": str(2**20)}


def _one_error_line(result, *needles: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def test_a_model_sent_with_the_cli_comes_back_as_the_local_report_and_a_plan_file(
        server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url, _, keys = server
    monkeypatch.setenv("TUNEBANK_DATA_DIR", str(tmp_path / "client"))
    # a fixed width: pytest-xdist's workers inherit a narrow one, and the console is made at import
    monkeypatch.setattr(cli_optimize, "console", Console(highlight=False, width=200))
    plan = tmp_path / "lm.tbplan"
    first = runner.invoke(app, ["optimize", MODEL, "--server", url, "--api-key", keys["alice"], "--k", "1",
                                "--out", str(plan)])
    assert first.exit_code == 0, first.output
    out = first.stdout
    assert "distinct subgraphs on cpu:" in out and "eager us" in out and "whole model: plan" in out, out
    assert f"job 1 on {url}" in out and f"plan: {plan}" in out
    torch.manual_seed(0)  # the zoo's seeded weights, as the client drew them
    module, inputs = zoo.build(MODEL, device="cpu")
    fast = tunebank.load(plan)  # the weights stayed on the client and went into the file, not over the wire
    with torch.no_grad():
        torch.testing.assert_close(fast(*inputs), module(*inputs), rtol=1e-4, atol=1e-5)

    monkeypatch.setenv("TUNEBANK_API_KEY", keys["alice"])
    again = runner.invoke(app, ["optimize", MODEL, "--server", url, "--k", "1", "--json"])
    assert again.exit_code == 0, again.output
    report = json.loads(again.stdout)
    assert (report["job"], report["server"], report["plan"]) == (1, url, None)  # the same model: the same job
    assert report["subgraphs"] and all(s["candidates"] is not None and s["eager_s"] for s in report["subgraphs"])
    assert report["model_s"] and report["eager_model_s"] and report["toolchain"].count("|") == 3


def test_server_errors_are_one_line_and_exit_2(server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url, _, keys = server
    monkeypatch.delenv("TUNEBANK_API_KEY", raising=False)
    nobody = f"http://127.0.0.1:{free_port()}"
    _one_error_line(runner.invoke(app, ["optimize", MODEL, "--server", nobody]), f"cannot reach {nobody}",
                    "tunebank serve")
    _one_error_line(runner.invoke(app, ["optimize", MODEL, "--server", url]), "needs an API key", "--api-key",
                    "TUNEBANK_API_KEY")
    _one_error_line(runner.invoke(app, ["optimize", MODEL, "--server", url, "--api-key", "tb_wrong"]),
                    "refused the API key")
    _one_error_line(runner.invoke(app, ["optimize", MODEL, "--server", url, "--api-key", keys["bob"]]),
                    "lacks scope 'optimize'")
    big = tmp_path / "big.onnx"
    big.write_bytes(b"\0" * (2**20 + 1))
    _one_error_line(runner.invoke(app, ["optimize", str(big), "--server", url, "--api-key", keys["alice"]]),
                    "too large", "TUNEBANK_MAX_MODEL_BYTES")
    _one_error_line(runner.invoke(app, ["optimize", MODEL, "--server", "127.0.0.1:8000"]), "http://127.0.0.1:8000")
    _one_error_line(runner.invoke(app, ["optimize", MODEL, "--server", url, "--backend", "cuda"]),
                    "--backend", "tunebank serve --backend")
    _one_error_line(runner.invoke(app, ["optimize", MODEL, "--device-class", "cpu:x"]), "--server")
