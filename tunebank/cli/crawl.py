"""``tunebank crawl``: fill the database on this machine's device: the demand queue, zoo models, ONNX files in the
configured folders; resumable (a crawl killed at any point goes on where it stopped when run again), one at a time
across processes, now or on a cron schedule (``--schedule "0 2 * * *"``). With ``--queue QUEUE`` the crawl is
published to the Celery workers of QUEUE instead, split into ``--shards`` jobs they run in parallel."""

import contextlib
import json
import logging
import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from db.errors import DbError
from db.migrate import check_schema
from db.session import Database
from embed.zoo import FAMILIES, families
from service.crawl_run import SHARD_SUBGRAPHS, CrawlParams
from service.crawl_schedule import CrawlBusyError, crawl_once, cron_trigger, schedule
from service.jobs import Executor, JobContext
from transforms.backends import BackendUnavailableError, resolve_backend
from transforms.search import strategies
from tunebank.cli.errors import fail
from tunebank.settings import Settings

console = Console(width=None if Console().is_terminal else 200, highlight=False)
log = logging.getLogger("tunebank.crawl")
WAIT_POLL_S = 10.0


def _csv(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _params(models: str, families_: str, sizes: str, onnx_dirs: tuple[str, ...], demand: bool, backend: str,
            strategy: str, budget: int, seed: int, cross: bool, retrain_min: int, *, here: bool,
            shards: int | None) -> CrawlParams:
    chosen = _csv(families_)
    strange = [m for m in _csv(models) if m.partition("-")[0] not in FAMILIES]
    if strange:
        fail(f"unknown zoo model {strange[0]!r}; zoo families: {', '.join(families())}")
    unknown = [f for f in chosen if f != "all" and f not in FAMILIES]
    if unknown:
        fail(f"unknown zoo family {unknown[0]!r}; choose from: all, {', '.join(families())}")
    if sizes not in ("default", "grid") and not sizes.isdigit():
        fail(f"bad --sizes {sizes!r}; use default, grid, or N (the first N sizes of each family)")
    if strategy not in strategies.names() or strategy == "given_candidates":
        fail(f"unknown strategy {strategy!r}; choose one of: exhaustive, random, evolutionary")
    if here and shards is not None:
        fail("--shards splits a crawl between the workers of a queue; give --queue QUEUE too")
    try:
        backend = resolve_backend(backend) if here else backend  # a submitted crawl resolves it on its worker
    except (ValueError, BackendUnavailableError) as e:
        fail(str(e))
    return CrawlParams(models=_csv(models), families=chosen, sizes=sizes, onnx_dirs=onnx_dirs, demand=demand,
                       backend=backend, strategy=strategy, budget=budget, seed=seed, cross=cross,
                       retrain_min=retrain_min, shards=1 if here else 0 if shards is None else shards)


def _summary(job: Any, seconds: float) -> Table:
    r = job.result or {}
    encoder = r.get("encoder") or {}
    table = Table("", "", title=f"crawl job {job.id}: {job.status} in {seconds:.1f} s", show_header=False)
    toolchain = str(r.get("toolchain") or "").splitlines()[:1]
    rows = [("device", f"{r.get('device')} ({' '.join(toolchain)})"), ("models", str(r.get("models"))),
            ("subgraphs", f"{r.get('subgraphs')} ({r.get('tuned')} tuned, {r.get('skipped')} crawled before)"),
            ("kernels measured", f"{r.get('measured')} ({r.get('measured', 0) / max(seconds, 1e-9):.2f}/s)"
             if job.attempts == 1 else f"{r.get('measured')} (in {job.attempts} attempts)"),
            ("cross applications", str(r.get("cross_applications"))),
            *[(f"skipped {path}", why) for path, why in (r.get("refused_files") or {}).items()],
            ("learned encoder", ("promoted " + str(encoder.get("version")) if encoder.get("promote") else
                                 "kept") + f": {encoder.get('reason')}")]
    for name, value in rows:
        table.add_row(name, value)
    return table


def _once(executor: Executor, params: CrawlParams, *, wait: bool, as_json: bool) -> None:
    start = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), console=console, transient=True, disable=as_json) as bar:
        task = bar.add_task("crawl", total=1.0)
        while True:
            try:
                job = crawl_once(executor, params.to_params(),
                                 listener=lambda f, m: bar.update(task, completed=f, description=m))
                break
            except KeyboardInterrupt:
                fail("interrupted; what was measured is stored: run the same command again to go on", code=130)
            except CrawlBusyError as e:
                if not wait:
                    fail(f"{e} (pass --wait to wait for it)")
                bar.update(task, description=f"waiting: {e}")
                time.sleep(WAIT_POLL_S)
    seconds = time.monotonic() - start
    if as_json:
        console.print_json(json.dumps({"job": job.id, "status": job.status, "seconds": seconds,
                                       "result": job.result, "error": job.error}))
    else:
        console.print(_summary(job, seconds))
    if job.status != "succeeded":
        fail(f"crawl job {job.id} {job.status}: {job.error}")


def _scheduled(executor: Executor, params: CrawlParams, cron: str) -> None:
    def fire() -> None:
        start = time.monotonic()
        try:
            job = crawl_once(executor, params.to_params())
        except CrawlBusyError as e:
            log.warning("scheduled crawl skipped: %s", e)
            return
        except Exception:  # the scheduler keeps running; the next firing tries again
            log.exception("scheduled crawl failed")
            return
        log.info("crawl job %s %s in %.1f s: %s", job.id, job.status, time.monotonic() - start,
                 json.dumps(job.result) if job.status == "succeeded" else job.error)

    console.print(f"crawling on schedule {cron!r} (one crawl at a time across processes); Ctrl-C stops")
    with contextlib.suppress(KeyboardInterrupt):
        schedule(cron, fire)


def crawl_command(
    models: Annotated[str, typer.Option(help="zoo models, comma-separated (names or family aliases)")] = "",
    families_: Annotated[str, typer.Option("--families", help="zoo families, comma-separated, or 'all'")] = "",
    sizes: Annotated[str, typer.Option(help="sizes of --families: default | grid | N (first N of a grid)")] = "default",
    onnx_dir: Annotated[list[str] | None, typer.Option(
        help="folder of .onnx models (repeatable), besides TUNEBANK_CRAWL_DIRS")] = None,
    demand: Annotated[bool, typer.Option(help="tune the subgraphs optimize queued (nearest neighbour far)")] = True,
    backend: Annotated[str, typer.Option(help="auto | cpu | cuda (auto: cuda when CuPy sees a GPU)")] = "auto",
    strategy: Annotated[str, typer.Option(help="exhaustive | random | evolutionary")] = "evolutionary",
    budget: Annotated[int, typer.Option(min=1, max=100_000, help="recipes to try per subgraph")] = 32,
    seed: Annotated[int, typer.Option(help="random seed (inputs and search)")] = 0,
    cross: Annotated[bool, typer.Option(help="cross-apply best recipes (what the learned encoder learns from)")] = True,
    retrain_min: Annotated[int, typer.Option(
        min=1, help="new profiled subgraphs since the last promoted encoder that trigger training one")] = 8,
    schedule_: Annotated[str | None, typer.Option(
        "--schedule", help="cron expression, e.g. '0 2 * * *': keep running and crawl on it")] = None,
    wait: Annotated[bool, typer.Option(help="when another crawl is running, wait for it instead of exiting")] = False,
    queue: Annotated[str | None, typer.Option(
        help="publish the crawl to the workers of this queue (`tunebank worker --queue QUEUE`) instead of running "
             "it here")] = None,
    shards: Annotated[int | None, typer.Option(
        min=0, help=f"with --queue: jobs the subgraphs to tune are split into, run in parallel by the queue's workers "
                    f"(default 0: one per {SHARD_SUBGRAPHS} subgraphs; 1: not split)")] = None,
    submit: Annotated[str | None, typer.Option(hidden=True, help="the former name of --queue")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Tune what is not yet in the database for this device and toolchain (demand queue, zoo models, ONNX folders),
    cross-apply best recipes, and retrain the learned encoder when enough new data arrived."""
    settings = Settings()
    queue = queue or submit
    dirs = tuple(dict.fromkeys([*settings.crawl_dir_list, *(onnx_dir or [])]))
    params = _params(models, families_, sizes, dirs, demand, backend, strategy, budget, seed, cross, retrain_min,
                     here=queue is None, shards=shards)
    if not (params.models or params.families or params.onnx_dirs or params.demand):
        fail("nothing to crawl: give --models, --families, --onnx-dir (or TUNEBANK_CRAWL_DIRS), or --demand")
    if schedule_ is not None and queue is not None:
        fail("--schedule runs crawls here; to crawl on a queue's workers nightly, schedule `tunebank crawl --queue`")
    if schedule_ is not None:
        try:
            cron_trigger(schedule_)
        except ValueError as e:
            fail(str(e))
    try:
        database = Database(settings.resolved_database_url)
        check_schema(database.engine)
    except DbError as e:
        fail(str(e))
    executor = Executor(JobContext(database, settings.data_dir, settings.index_dir), kinds={"crawl"},
                        lease_s=settings.job_lease_s)
    try:
        if queue is not None:
            from service.jobs_celery import celery_app, submit_to

            job_id = submit_to(celery_app(settings.broker_url), database, "crawl", params.to_params(), queue=queue)
            split = "not split" if params.shards == 1 else (
                f"in {params.shards} shards" if params.shards else f"in shards of {SHARD_SUBGRAPHS} subgraphs")
            console.print(f"crawl job {job_id} published to queue {queue!r} ({split})", markup=False)
        elif schedule_ is None:
            _once(executor, params, wait=wait, as_json=as_json)
        else:
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
            _scheduled(executor, params, schedule_)
    finally:
        database.dispose()
