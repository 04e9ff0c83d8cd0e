"""Crawls as jobs, killed with SIGKILL and restarted: the database ends as after an uninterrupted crawl, and no
kernel is measured twice. The crawl runs in child processes (this file run as a script), with the synthetic
measurer so that both crawls take the same decisions; the child kills itself at a measurement or a progress step.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from db.migrate import upgrade
from db.models import Baseline, Demand, Device, Embedding, Job, Measurement, Model, Recipe, Subgraph
from db.repositories.model_catalog import model_subgraph_ids
from db.session import Database
from tests.db.conftest import _require_postgres, pg_schema_factory, pg_url  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("lm_head-h64-v256-t32", "cnn_head-c32-i7-b1")
DEMANDED = "lm_head-h32-v128-t16"  # a model no crawl names: one of its subgraphs is in the demand queue
PARAMS = {"models": list(MODELS), "budget": 3, "retrain_min": 2}


def child(db_url: str, data_dir: Path, log: Path, kill: str = "", params: dict | None = None,
          run: bool = True, device: str = "test") -> Any:
    """Run ``crawl_once`` in a child (job kinds of ``synthetic_kinds``); ``kill``: ``measure:N`` (at the N-th
    measuring call) or ``progress:TEXT``; ``schedule:N``: crawl every second on a cron schedule, and exit after N
    crawls."""
    command = [sys.executable, __file__, db_url, str(data_dir), str(log), json.dumps(params or PARAMS), kill, device]
    options = {"cwd": ROOT, "text": True, "env": {**os.environ, "PYTHONPATH": str(ROOT)}}
    if not run:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **options)
    return subprocess.run(command, capture_output=True, timeout=300, **options)


def seed_demand(db_url: str) -> None:
    from embed import zoo
    from embed.partition import partition
    from service.store import add_subgraphs, register_device
    from tests.service.conftest import DEVICE

    database = Database(db_url)
    upgrade(database.engine)
    subgraph = next(s for s in partition(zoo.load(DEMANDED)) if s.tunable and s.kind.value != "contraction")
    with database.scope() as session:
        device_id = register_device(session, DEVICE)
        ids = add_subgraphs(session, [subgraph])
        session.add(Demand(subgraph_id=ids[subgraph.structural_hash], device_id=device_id, distance=3.0))
    database.dispose()


def snapshot(db_url: str, data_dir: Path) -> dict[str, Any]:
    """The database by natural keys (no row ids or times), and the encoder files."""
    database = Database(db_url)
    with database.scope() as session:
        hashes = dict(session.execute(select(Subgraph.id, Subgraph.structural_hash)).all())
        recipes = dict(session.execute(select(Recipe.id, Recipe.canonical)).all())
        devices = dict(session.execute(select(Device.id, Device.name)).all())
        kinds = dict(session.execute(select(Job.id, Job.kind)).all())
        state = {
            "subgraphs": sorted(hashes.values()),
            "measurements": sorted((hashes[m.subgraph_id], recipes[m.recipe_id], devices[m.device_id], m.toolchain,
                                    m.median_s, m.ok, m.error_kind, kinds.get(m.job_id))
                                   for m in session.scalars(select(Measurement))),
            "baselines": sorted((hashes[b.subgraph_id], devices[b.device_id], b.toolchain, b.eager_s)
                                for b in session.scalars(select(Baseline))),
            "embeddings": sorted((hashes[e.subgraph_id], devices[e.device_id], e.encoder, e.encoder_version,
                                  e.vector.hex()) for e in session.scalars(select(Embedding))),
            "demand": sorted((hashes[d.subgraph_id], d.status) for d in session.scalars(select(Demand))),
            "models": sorted((m.name, m.content_hash, tuple(hashes[i] for i in model_subgraph_ids(session, m.id)))
                             for m in session.scalars(select(Model))),
            "crawls": sorted((j.status, json.dumps(j.result, sort_keys=True))
                             for j in session.scalars(select(Job).where(Job.kind == "crawl"))),
            "encoders": sorted(str(p.relative_to(data_dir)) for p in (data_dir / "encoders").rglob("*")),
        }
        state["promoted"] = [p.read_text() for p in sorted((data_dir / "encoders").rglob("promoted"))]
    database.dispose()
    return state


def measured(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def reference_crawl(tmp_path: Path, other: str) -> tuple[Path, Path, dict[str, Any]]:
    """Two data folders with the same demand, ``reference`` and ``other``; the crawl run uninterrupted in the first,
    and the snapshot it left."""
    reference, second = tmp_path / "reference", tmp_path / other
    for folder in (reference, second):
        folder.mkdir()
        seed_demand(f"sqlite:///{folder / 'tunebank.db'}")
    done = child(f"sqlite:///{reference / 'tunebank.db'}", reference, reference / "measured.log")
    assert done.returncode == 0, done.stderr
    return reference, second, snapshot(f"sqlite:///{reference / 'tunebank.db'}", reference)


@pytest.mark.slow
def test_a_crawl_killed_three_times_ends_like_an_uninterrupted_one_and_a_rerun_measures_nothing(tmp_path: Path) -> None:
    reference, resumed, expected = reference_crawl(tmp_path, "resumed")
    url = f"sqlite:///{reference / 'tunebank.db'}"
    again = child(url, reference, reference / "again.log")  # the same crawl again measures nothing
    assert again.returncode == 0, again.stderr
    assert not measured(reference / "again.log") and (json.loads(again.stdout)["measured"], json.loads(
        again.stdout)["tuned"]) == (0, 0)

    url = f"sqlite:///{resumed / 'tunebank.db'}"
    for kill in ("measure:4", "progress:cross 2/", "progress:encoder: training"):
        killed = child(url, resumed, resumed / "measured.log", kill)
        assert killed.returncode == -signal.SIGKILL, f"{kill}: not killed\n{killed.stderr}"
    done = child(url, resumed, resumed / "measured.log")
    assert done.returncode == 0, done.stderr

    assert snapshot(url, resumed) == expected
    assert len(measured(resumed / "measured.log")) == len(set(measured(resumed / "measured.log")))  # none twice
    assert sorted(measured(resumed / "measured.log")) == sorted(measured(reference / "measured.log"))
    assert ("crawled" in {status for _, status in expected["demand"]}) and expected["promoted"]
    assert [name for name, _, _ in expected["models"]] == sorted(PARAMS["models"])  # the catalog
    database = Database(url)
    with database.scope() as session:
        (job,) = session.scalars(select(Job).where(Job.kind == "crawl"))
        assert (job.status, job.attempts) == ("succeeded", 4)
    database.dispose()


def without_shards(state: dict[str, Any]) -> dict[str, Any]:
    """``snapshot`` with the crawl results' list of shard jobs left out (the one thing a sharded crawl adds)."""
    results = [(status, json.loads(result)) for status, result in state["crawls"]]
    return {**state, "crawls": sorted((status, json.dumps({k: v for k, v in r.items() if k != "shards"},
                                                          sort_keys=True)) for status, r in results)}


def test_a_crawl_in_shards_killed_in_one_ends_like_an_unsharded_one(tmp_path: Path) -> None:
    reference, sharded, expected = reference_crawl(tmp_path, "sharded")

    url, log = f"sqlite:///{sharded / 'tunebank.db'}", sharded / "measured.log"
    killed = child(url, sharded, log, "shard:2:2", {**PARAMS, "shards": 3})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    done = child(url, sharded, log, params={**PARAMS, "shards": 3})
    assert done.returncode == 0, done.stderr

    state = snapshot(url, sharded)
    assert without_shards(state) == without_shards(expected) and state["crawls"] != expected["crawls"]
    assert len(measured(log)) == len(set(measured(log)))  # none twice
    assert sorted(measured(log)) == sorted(measured(reference / "measured.log"))
    database = Database(url)
    with database.scope() as session:
        (crawl,) = session.scalars(select(Job).where(Job.kind == "crawl"))
        shards = list(session.scalars(select(Job).where(Job.kind == "crawl_shard").order_by(Job.id)))
    database.dispose()
    assert crawl.result["shards"] == [j.id for j in shards] and crawl.attempts == 2
    assert [(j.status, j.attempts, j.params["crawl"]) for j in shards] == [
        ("succeeded", 1, crawl.id), ("succeeded", 2, crawl.id), ("succeeded", 1, crawl.id)]
    parts = [j.params["subgraphs"] for j in shards]  # every subgraph tuned, in one shard only
    assert sorted(h for p in parts for h in p) == sorted({line.split()[0] for line in measured(log)})
    assert len({h for p in parts for h in p}) == crawl.result["tuned"] and all(parts)


def test_two_schedulers_on_one_database_never_crawl_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tunebank.db'}"
    seed_demand(url)
    schedulers = [child(url, tmp_path, tmp_path / "measured.log", "schedule:3", {**PARAMS, "seed": seed}, run=False)
                  for seed in (1, 2)]
    for scheduler in schedulers:
        _, stderr = scheduler.communicate(timeout=300)
        assert scheduler.returncode == 0, stderr
    database = Database(url)
    with database.scope() as session:
        crawls = sorted((j.started_at, j.finished_at, j.params["seed"])
                        for j in session.scalars(select(Job).where(Job.kind == "crawl")))
    database.dispose()
    assert len(crawls) == 6 and {seed for *_, seed in crawls} == {1, 2}
    for (_, finished, _), (started, _, _) in zip(crawls, crawls[1:], strict=False):
        assert finished <= started, "two crawls ran at once"


def test_zoo_names_cover_models_then_families_at_their_sizes() -> None:
    from embed import zoo
    from service.crawl_run import CrawlParams, zoo_names

    gcn = zoo.FAMILIES.get("gcn").members()
    assert zoo_names(CrawlParams(models=("lm_head-h64-v256-t32", "gcn"), families=("gcn",))) == [
        "lm_head-h64-v256-t32", "gcn"]
    assert zoo_names(CrawlParams(families=("gcn",), sizes="2")) == gcn[:2]
    assert zoo_names(CrawlParams(families=("gcn",), sizes="grid")) == gcn
    assert zoo_names(CrawlParams(families=("all",))) == zoo.families()
    with pytest.raises(ValueError, match="bad sizes"):
        zoo_names(CrawlParams(families=("gcn",), sizes="big"))


@pytest.mark.postgres
def test_a_crawl_on_postgresql_stores_once_and_a_rerun_measures_nothing(request, tmp_path: Path) -> None:
    _require_postgres()
    url = pg_url(request.getfixturevalue("pg_schema_factory")("crawl"))
    seed_demand(url)
    first = child(url, tmp_path, tmp_path / "first.log")
    second = child(url, tmp_path, tmp_path / "second.log")
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert measured(tmp_path / "first.log") and not measured(tmp_path / "second.log")
    state = snapshot(url, tmp_path)
    assert len(state["measurements"]) == len(set(measured(tmp_path / "first.log")))
    assert {status for _, status in state["demand"]} == {"crawled"} and state["baselines"]


def synthetic_kinds(data_dir: Path, log: Path, kill: str = "", *, device: str = "test",
                    delay_s: float = 0.0) -> Any:
    """Job kinds ``crawl`` and ``crawl_shard`` measuring with the synthetic measurer, on the test device or (``device``
    ``local``) under this machine's cpu name and toolchain, so that optimize finds what they stored. Each measured
    recipe is appended to ``log`` as ``KEY RECIPE``, each measuring call takes ``delay_s`` more; ``kill`` ends the
    process (SIGKILL) at the N-th measuring call (``measure:N``) or at the N-th measuring call of the S-th shard it
    runs (``shard:S:N``)."""
    from dataclasses import replace

    from embed.registry import Registry
    from service.crawl_run import CrawlParams, run_crawl, run_shard
    from service.embeddings import EncoderStore
    from service.measure import MeasurementTable, Measurer
    from tests.service.conftest import DEVICE, synthetic_measurer

    what, _, where = kill.partition(":")
    calls, shards, shard_calls = 0, 0, 0
    synthetic = synthetic_measurer()
    table = synthetic.table
    if device == "local":
        from service.devices import cpu_device, toolchain

        here = cpu_device(repeats=1)  # its name and class; the peaks stay the test device's (the same in every run)
        table = MeasurementTable(replace(DEVICE, name=here.name, device_class=here.device_class, arch=here.arch),
                                 toolchain("cpu"))

    def run(task, recipes):  # noqa: ANN001, ANN202
        nonlocal calls, shard_calls
        calls, shard_calls = calls + 1, shard_calls + 1
        if (what == "measure" and calls == int(where)) or (
                what == "shard" and f"{shards}:{shard_calls}" == where):
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(delay_s)
        with open(log, "a") as out:
            out.writelines(f"{task.key} {r}\n" for r in recipes)
        return synthetic.run(task, recipes)

    def measurer() -> Measurer:
        return Measurer(type(table)(table.device, table.toolchain), run=run, eager_time=synthetic.eager_time)

    def crawl(params: dict[str, Any], progress: Any) -> dict[str, Any]:
        return run_crawl(progress.context.database, CrawlParams.from_params(params), measurer(),
                         store=EncoderStore(Path(data_dir) / "encoders"), progress=progress)

    def shard(params: dict[str, Any], progress: Any) -> dict[str, Any]:
        nonlocal shards, shard_calls
        shards, shard_calls = shards + 1, 0
        try:
            return run_shard(progress.context.database, params, measurer(), progress=progress)
        finally:
            shard_calls = -10**9  # the crawl's own measuring (cross table) is not a shard's

    registry = Registry("job kind")
    registry.register("crawl", crawl)
    registry.register("crawl_shard", shard)
    return registry


def main(db_url: str, data_dir: str, log: str, params: str, kill: str, device: str = "test") -> None:
    """The child: one ``crawl_once`` with the synthetic measurer; prints the job's result."""
    from service.crawl_schedule import crawl_once
    from service.jobs import Executor, JobContext

    what, _, where = kill.partition(":")

    def listen(fraction: float, message: str) -> None:
        if what == "progress" and message.startswith(where):
            os.kill(os.getpid(), signal.SIGKILL)

    database = Database(db_url)
    executor = Executor(JobContext(database, Path(data_dir), Path(data_dir) / "index"), kinds={"crawl"},
                        registry=synthetic_kinds(Path(data_dir), Path(log), kill, device=device))
    if what == "schedule":
        schedule_crawls(executor, json.loads(params), int(where))
    job = crawl_once(executor, json.loads(params), listener=listen)
    print(json.dumps(job.result if job.status == "succeeded" else {"error": job.error}))
    sys.exit(0 if job.status == "succeeded" else 1)


def schedule_crawls(executor: Any, params: dict[str, Any], crawls: int) -> None:
    """Crawl every second (skipping while another process crawls); exit after ``crawls`` crawls."""
    from service.crawl_schedule import CrawlBusyError, crawl_once, schedule

    done = 0

    def fire() -> None:
        nonlocal done
        try:
            job = crawl_once(executor, params)
        except CrawlBusyError:
            return
        if job.status != "succeeded":
            print(job.error, file=sys.stderr)
            os._exit(1)
        done += 1
        if done == crawls:
            os._exit(0)

    schedule("* * * * * *", fire)


if __name__ == "__main__":
    main(*sys.argv[1:7])
