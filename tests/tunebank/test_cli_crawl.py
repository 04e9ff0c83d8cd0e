"""``tunebank crawl`` on the cpu backend: a tiny zoo model and an ONNX folder crawled for real, a second crawl
measures nothing; bad input and a crawl already running end with one line."""

import json
import secrets
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from db.migrate import upgrade
from db.repositories import jobs
from db.session import Database
from tunebank.cli import app

runner = CliRunner()


def _onnx_softmax(path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    database = Database(f"sqlite:///{tmp_path / 'tunebank.db'}")
    upgrade(database.engine)
    database.dispose()
    return {"TUNEBANK_DATA_DIR": str(tmp_path)}


@pytest.mark.slow
def test_crawl_tunes_zoo_models_and_onnx_folders_once(tmp_path: Path, env: dict[str, str]) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    _onnx_softmax(folder / "softmax.onnx")
    (folder / "broken.onnx").write_bytes(b"not onnx")
    args = ["crawl", "--models", "cnn_head-c32-i7-b1", "--backend", "cpu", "--budget", "2", "--json"]
    env = {**env, "TUNEBANK_CRAWL_DIRS": str(folder)}
    first = runner.invoke(app, args, env=env)
    assert first.exit_code == 0, first.output
    result = json.loads(first.stdout)["result"]
    assert result["tuned"] == result["subgraphs"] >= 2 and result["measured"] >= 2 * result["tuned"]
    assert list(result["refused_files"]) == [str(folder / "broken.onnx")]
    again = runner.invoke(app, args, env=env)
    assert again.exit_code == 0, again.output
    result = json.loads(again.stdout)["result"]
    assert (result["tuned"], result["skipped"], result["measured"]) == (0, result["subgraphs"], 0)


@pytest.mark.parametrize(("args", "message"), [
    ([], "nothing to crawl"),
    (["--models", "resnet_stem,nope-h1"], "unknown zoo model 'nope-h1'"),
    (["--families", "gcn,nope"], "unknown zoo family 'nope'"),
    (["--models", "gcn", "--sizes", "big"], "bad --sizes"),
    (["--models", "gcn", "--strategy", "transfer"], "unknown strategy"),
    (["--models", "gcn", "--schedule", "0 2 * *"], "a schedule has 5 fields"),
    (["--models", "gcn", "--schedule", "0 25 * * *"], "25"),
    (["--models", "gcn", "--shards", "2"], "give --queue QUEUE too"),
    (["--models", "gcn", "--queue", "cpu", "--schedule", "0 2 * * *"], "--schedule runs crawls here"),
])
def test_bad_input_ends_with_one_line(args: list[str], message: str, env: dict[str, str]) -> None:
    result = runner.invoke(app, ["crawl", "--no-demand", "--backend", "cpu", *args], env=env)
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_a_crawl_already_running_is_not_started_twice(tmp_path: Path, env: dict[str, str]) -> None:
    database = Database(f"sqlite:///{tmp_path / 'tunebank.db'}")
    with database.scope() as session:
        jobs.acquire_lock(session, "crawl", owner="elsewhere:1:abc", lease_s=600)
    result = runner.invoke(app, ["crawl", "--models", "gcn", "--backend", "cpu"], env=env)
    assert result.exit_code == 2 and "already running (elsewhere:1:abc until" in result.output
    with database.scope() as session:
        assert jobs.list_jobs(session, kind="crawl") == []
    database.dispose()


@pytest.mark.parametrize(("args", "shards", "split"), [
    ([], 0, "in shards of 8 subgraphs"), (["--shards", "3"], 3, "in 3 shards"), (["--shards", "1"], 1, "not split")])
def test_a_crawl_on_a_queue_is_published_for_its_workers_in_shards(
        tmp_path: Path, env: dict[str, str], args: list[str], shards: int, split: str) -> None:
    import redis

    from tests.service.test_jobs_celery import BROKER, _require_redis

    _require_redis()
    queue = f"test-{secrets.token_hex(4)}"
    result = runner.invoke(app, ["crawl", "--models", "gcn", "--queue", queue, *args],
                           env={**env, "TUNEBANK_BROKER_URL": BROKER})
    assert result.exit_code == 0, result.output
    database = Database(f"sqlite:///{tmp_path / 'tunebank.db'}")
    with database.scope() as session:
        (job,) = jobs.list_jobs(session, kind="crawl")
        assert (job.status, job.params["backend"], job.params["_queue"], job.params["shards"]) == (
            "queued", "auto", queue, shards)
    database.dispose()
    assert f"crawl job {job.id} published to queue {queue!r} ({split})" in result.output
    client = redis.Redis.from_url(BROKER)
    try:
        assert client.llen(queue) == 1
    finally:
        client.delete(queue)
