"""The Python client against a live ``tunebank serve`` (a real uvicorn process on 127.0.0.1, SQLite, the cpu
backend): a tiny zoo model optimized end to end, its plan run and compared with eager; keys and ownership as the
client sees them; retries on 429 and 5xx; ``tunebank.local()`` giving the same calls without a server."""

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

import tunebank
from embed import zoo
from tests.tunebank.conftest import cli, free_port
from tunebank.reports import Job, Report

ROOT = Path(__file__).resolve().parents[2]
MODEL = "lm_head-h64-v256-t32"


def test_a_module_sent_to_the_server_comes_back_as_a_plan_that_computes_what_it_computes(
        server, tmp_path: Path) -> None:
    url, _, secrets = server
    torch.manual_seed(0)
    module, inputs = zoo.build(MODEL, device="cpu")
    with tunebank.Client(url, secrets["alice"], progress=False, cache_dir=tmp_path / "kernels") as client:
        job = client.optimize(module, inputs, k=1, timeout_s=300)
        assert isinstance(job, Job) and job.status == "succeeded", job
        assert isinstance(job.report, Report) and job.report.model == f"{type(module).__name__}.json"
        assert {s.source for s in job.report.subgraphs} <= {"hit", "transfer", "not tunable"}
        assert all(s.eager_s is not None for s in job.report.subgraphs) and job.report.eager_model_s
        assert "vs eager" in repr(job) and f"Job({job.id}, optimize, succeeded)" in repr(job)
        fast = client.plan(job.id)
        assert isinstance(fast, tunebank.PlanModule)  # what tunebank.load gives
        with torch.no_grad():
            torch.testing.assert_close(fast(*inputs), module(*inputs), rtol=1e-4, atol=1e-5)
        saved = client.download_plan(job.id, tmp_path / "lm.tbplan")
        loaded = tunebank.load(saved, params=dict(module.named_parameters()))
        with torch.no_grad():
            torch.testing.assert_close(loaded(*inputs), fast(*inputs))
        again = client.optimize(module, inputs, k=1, wait=False)  # the same model: the same job, no new tuning
        assert again.id == job.id and again.status == "succeeded"
        assert [j.id for j in client.jobs()] == [job.id]
        assert client.stats().tables["jobs"] >= 1
    with tunebank.Client(url, secrets["bob"], progress=False, retries=0) as bob:
        with pytest.raises(tunebank.ApiError) as missing:
            bob.job(job.id)
        assert missing.value.status == 404 and bob.jobs() == []
        with pytest.raises(tunebank.ApiError) as refused:
            bob.optimize(module, inputs)
        assert refused.value.status == 403 and "optimize" in refused.value.detail
    with tunebank.Client(url, "tb_wrong", progress=False, retries=0) as stranger, \
            pytest.raises(tunebank.ApiError) as unknown:
        stranger.stats()
    assert unknown.value.status == 401


def test_serve_refuses_to_bind_beyond_loopback_without_a_key(tmp_path: Path) -> None:
    env = {**os.environ, "TUNEBANK_DATA_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "tunebank", "serve", "--host", "0.0.0.0", "--port",
                           str(free_port())], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "refusing to serve on '0.0.0.0' with no API key" in done.stderr


def test_keys_are_created_listed_and_revoked_and_the_secret_is_printed_once(tmp_path: Path) -> None:
    env = {**os.environ, "TUNEBANK_DATA_DIR": str(tmp_path), "COLUMNS": "200"}
    cli(env, "db", "upgrade")
    created = cli(env, "keys", "create", "--scopes", "read,ingest", "--name", "crawler").splitlines()
    assert created[0] == "key 1 (crawler), scopes ingest,read" and created[1].startswith("tb_")
    listed = cli(env, "keys", "list")
    assert "crawler" in listed and "live" in listed and created[1] not in listed
    assert cli(env, "keys", "revoke", "1").strip() == "key 1 revoked"
    assert "revoked" in cli(env, "keys", "list")
    from typer.testing import CliRunner

    from tunebank.cli import app

    bad = CliRunner().invoke(app, ["keys", "create", "--scopes", "root"], env=env)
    assert bad.exit_code == 2 and "unknown scope 'root'" in bad.stderr


def _replying(*statuses: int) -> tuple[httpx.MockTransport, list[int]]:
    seen: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        status = statuses[min(len(seen), len(statuses) - 1)]
        seen.append(status)
        if status == 200:
            return httpx.Response(200, json={"tables": {"jobs": 1}, "devices": [], "kinds": []})
        return httpx.Response(status, json={"error": "busy", "detail": "try later"}, headers={"Retry-After": "0"})

    return httpx.MockTransport(handler), seen


def test_the_client_retries_429_and_5xx_with_backoff_then_gives_up_with_the_servers_message() -> None:
    transport, seen = _replying(429, 503, 500, 200)
    client = tunebank.Client("http://tb", "k", transport=transport, backoff_s=0.001)
    assert client.stats().tables == {"jobs": 1} and seen == [429, 503, 500, 200]
    transport, seen = _replying(502)
    client = tunebank.Client("http://tb", "k", transport=transport, backoff_s=0.001, retries=2)
    with pytest.raises(tunebank.ApiError) as gave_up:
        client.stats()
    assert (gave_up.value.status, gave_up.value.detail, len(seen)) == (502, "try later", 3)
    transport, seen = _replying(404)
    with pytest.raises(tunebank.ApiError):
        tunebank.Client("http://tb", "k", transport=transport, backoff_s=0.001).stats()
    assert seen == [404]  # a client error is not retried


def test_to_dataframe_says_plainly_when_pandas_is_missing() -> None:
    report = Report.from_json({"model": "m", "backend": "cpu", "device": "d", "toolchain": "t", "subgraphs": [
        {"name": "m #0", "kind": "contraction", "structural_hash": "a" * 64, "ops": ["matmul"], "source": "hit",
         "choice": "kernel", "kernel_s": 1e-5, "eager_s": 2e-5, "speedup": 2.0}]})
    assert report.to_rows()[0]["speedup"] == 2.0 and "2.00x" in repr(report)
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install pandas"):
            report.to_dataframe()
    else:
        assert list(report.to_dataframe()["speedup"]) == [2.0]


def test_local_gives_the_same_calls_without_a_server(tmp_path: Path) -> None:
    settings = tunebank.settings.Settings(data_dir=tmp_path)
    with tunebank.local(settings, backend="cpu", progress=False) as tb:
        job = tb.optimize(MODEL, k=1, timeout_s=300)  # a zoo name: built here, sent as IR, weights kept here
        assert job.status == "succeeded" and job.report is not None, job
        fast = tb.plan(job.id)
        torch.manual_seed(0)
        module, inputs = zoo.build(MODEL, device="cpu")
        with torch.no_grad():
            torch.testing.assert_close(fast(*inputs), module(*inputs), rtol=1e-4, atol=1e-5)
        assert [j.id for j in tb.jobs()] == [job.id] and tb.stats().tables["jobs"] == 1
    assert (tmp_path / "tunebank.db").is_file()


def test_an_onnx_export_is_sent_with_its_external_weights_inlined(tmp_path: Path) -> None:
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import uses_external_data

    from tests.tunebank.test_api import Block
    from tunebank.client import _wire

    torch.manual_seed(3)
    module = Block().eval()
    torch.onnx.export(module, (torch.randn(8, 32),), str(tmp_path / "block.onnx"))  # weights in block.onnx.data
    assert (tmp_path / "block.onnx.data").is_file()
    data, name, kept = _wire(str(tmp_path / "block.onnx"), None)
    proto = onnx.load_model_from_string(data)
    assert name == "block.onnx" and kept is None
    assert proto.graph.initializer and not any(uses_external_data(t) for t in proto.graph.initializer)
    sent = sorted(numpy_helper.to_array(t).round(6).tobytes() for t in proto.graph.initializer)
    own = sorted(p.detach().numpy().round(6).tobytes() for p in module.parameters())
    assert sent == own
