"""Crawls one at a time across processes, now or on a cron schedule.

``crawl_once`` takes the database lock ``crawl`` (a lease row in the jobs table), finishes any crawl job that an
earlier process left unfinished, and runs the crawl ``params`` ask for (resuming it when an unfinished job has the
same params). ``schedule`` fires it on a cron trigger (APScheduler); a firing that finds the lock held elsewhere
(another scheduler, or a crawl still running from the night before) skips, so crawls never overlap.
"""

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from db.models import Job
from db.repositories import jobs
from db.repositories.jobs import JobStatus
from service.jobs import Executor, Listener

log = logging.getLogger(__name__)

KIND = "crawl"
LOCK = "crawl"
_UNFINISHED = (JobStatus.QUEUED, JobStatus.RUNNING)


class CrawlBusyError(RuntimeError):
    """Another process holds the crawl lock."""


def _pending(executor: Executor, params: dict[str, Any]) -> int:
    """The unfinished crawl job with these params (the oldest), or a new one."""
    with executor.database.scope() as session:
        rows = session.execute(select(Job.id, Job.params).where(Job.kind == KIND, Job.status.in_(_UNFINISHED))
                               .order_by(Job.id)).all()
        same = [job_id for job_id, p in rows if p == params]
        return same[0] if same else jobs.enqueue(session, KIND, params).id


def crawl_once(executor: Executor, params: dict[str, Any], *, listener: Listener | None = None) -> Job:
    """Run the crawl ``params`` describe (after any crawl left unfinished) under the crawl lock; its job row.

    Raises ``CrawlBusyError`` naming the holder when another process holds the lock."""
    with executor.holding(LOCK) as taken:
        if not taken:
            with executor.database.scope() as session:
                holder = jobs.lock_holder(session, LOCK)
            who = f"{holder[0]} until {holder[1]:%Y-%m-%d %H:%M:%S} UTC" if holder else "another process"
            raise CrawlBusyError(f"a crawl is already running ({who}); not starting another")
        job_id = _pending(executor, params)
        while True:
            with executor.database.scope() as session:
                job = jobs.get_job(session, job_id)
            if job.status not in _UNFINISHED:
                return job
            if executor.run_next(listener) is None:  # attempts used up, or claimed elsewhere
                with executor.database.scope() as session:
                    return jobs.get_job(session, job_id)


def cron_trigger(cron: str, *, timezone: str | None = None) -> Any:
    """An APScheduler trigger for ``cron``: 5 fields (minute hour day month weekday) or 6 (seconds first).

    Raises ``ValueError`` with the reason when it is not a valid schedule."""
    from apscheduler.triggers.cron import CronTrigger

    fields = cron.split()
    if len(fields) == 5:
        return CronTrigger.from_crontab(cron, timezone=timezone)
    if len(fields) == 6:
        names = ("second", "minute", "hour", "day", "month", "day_of_week")
        return CronTrigger(**dict(zip(names, fields, strict=True)), timezone=timezone)
    raise ValueError(f"a schedule has 5 fields (minute hour day month weekday) or 6 (seconds first), got {cron!r}")


def schedule(cron: str, fire: Callable[[], None], *, timezone: str | None = None) -> None:
    """Call ``fire`` on the cron expression ``cron`` until interrupted (one firing at a time in this process)."""
    from apscheduler.schedulers.blocking import BlockingScheduler

    scheduler = BlockingScheduler(timezone=timezone) if timezone else BlockingScheduler()
    scheduler.add_job(fire, cron_trigger(cron, timezone=timezone), max_instances=1, coalesce=True,
                      misfire_grace_time=3600)
    scheduler.start()
