"""``tunebank worker --queue cuda-h200``: a Celery worker over Redis that runs jobs from the jobs table, one at a
time (start one per GPU); results go to the database."""

from typing import Annotated

import typer

from db.errors import DbError
from db.migrate import check_schema
from db.session import Database
from service.jobs import Executor, JobContext
from tunebank.cli.errors import fail
from tunebank.settings import Settings


def worker_command(
    queue: Annotated[str, typer.Option(help="queue to consume, named by device class (e.g. cuda-h200, cpu)")],
    broker: Annotated[str | None, typer.Option(help="broker URL (default: TUNEBANK_BROKER_URL)")] = None,
    loglevel: Annotated[str, typer.Option(help="DEBUG | INFO | WARNING")] = "INFO",
) -> None:
    """Run jobs published to QUEUE (crawl, optimize) one at a time, until stopped."""
    from service.jobs_celery import celery_app, run_worker

    settings = Settings()
    try:
        database = Database(settings.resolved_database_url)
        check_schema(database.engine)
    except DbError as e:
        fail(str(e))
    executor = Executor(JobContext(database, settings.data_dir, settings.index_dir), lease_s=settings.job_lease_s)
    try:
        run_worker(celery_app(broker or settings.broker_url), executor, queue=queue, loglevel=loglevel)
    finally:
        database.dispose()
