import datetime as dt
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import event, update

from db.models import Job
from db.repositories.jobs import JobStatus, claim_next, enqueue, finish, get_job, heartbeat, list_jobs
from db.session import Database


def _expire(database: Database, job_id: int) -> None:
    with database.scope() as session:
        past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
        session.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=past))


def test_jobs_are_claimed_once_in_order_and_by_kind(database: Database) -> None:
    with database.scope() as session:
        first = enqueue(session, "optimize", {"model": "a"}).id
        crawl = enqueue(session, "crawl", {}).id
        second = enqueue(session, "optimize", {"model": "b"}).id
    with database.scope() as session:
        a = claim_next(session, owner="w1", lease_s=60, kinds={"optimize"})
        b = claim_next(session, owner="w2", lease_s=60, kinds={"optimize"})
        none = claim_next(session, owner="w3", lease_s=60, kinds={"optimize"})
        assert a is not None and b is not None and none is None
        assert (a.id, a.status, a.lease_owner, a.attempts, a.params) == (first, "running", "w1", 1, {"model": "a"})
        assert (b.id, b.lease_owner) == (second, "w2")
    with database.scope() as session:
        assert [j.id for j in list_jobs(session, status=JobStatus.QUEUED)] == [crawl]


def test_a_lost_lease_is_claimed_again_and_attempts_are_capped(database: Database) -> None:
    with database.scope() as session:
        job_id = enqueue(session, "crawl", {}).id
        claim_next(session, owner="dead", lease_s=60)
    with database.scope() as session:
        assert claim_next(session, owner="w2", lease_s=60) is None  # lease still held
    _expire(database, job_id)
    with database.scope() as session:
        job = claim_next(session, owner="w2", lease_s=60, max_attempts=2)
        assert job is not None and (job.id, job.attempts, job.lease_owner) == (job_id, 2, "w2")
        assert not heartbeat(session, job_id, owner="dead", lease_s=60)  # the old worker lost it
        assert heartbeat(session, job_id, owner="w2", lease_s=60, progress=0.5)
    _expire(database, job_id)
    with database.scope() as session:
        assert claim_next(session, owner="w3", lease_s=60, max_attempts=2) is None
        job = get_job(session, job_id)
        assert (job.status, job.error, job.progress) == ("failed", "gave up after 2 attempts", 0.5)


def test_finish_records_result_only_for_the_holder(database: Database) -> None:
    with database.scope() as session:
        job_id = enqueue(session, "optimize", {}).id
        claim_next(session, owner="w1", lease_s=60)
        assert not finish(session, job_id, owner="w2", status=JobStatus.SUCCEEDED, result={"x": 1})
        assert finish(session, job_id, owner="w1", status=JobStatus.SUCCEEDED, result={"speedup": 2.5})
        assert not finish(session, job_id, owner=None, status=JobStatus.CANCELLED)  # already over
    with database.scope() as session:
        job = get_job(session, job_id)
        assert (job.status, job.result, job.progress, job.lease_owner) == ("succeeded", {"speedup": 2.5}, 1.0, None)
        assert job.finished_at is not None


@contextmanager
def between_select_and_update(database: Database, meanwhile: Callable[[], None]) -> Iterator[None]:
    """Runs ``meanwhile()`` (in its own transaction) once, right after the next SELECT of the jobs table: another
    worker acting between a claim's read of the oldest job and its conditional UPDATE."""
    done: list[bool] = []

    def after(conn, cursor, statement: str, *_: object) -> None:
        if not done and statement.lstrip().upper().startswith("SELECT") and "jobs" in statement:
            done.append(True)
            meanwhile()

    event.listen(database.engine, "after_cursor_execute", after)
    try:
        yield
    finally:
        event.remove(database.engine, "after_cursor_execute", after)
    assert done


def test_a_job_cancelled_between_read_and_claim_is_not_claimed(database: Database) -> None:
    with database.scope() as session:
        job_id = enqueue(session, "crawl", {}).id

    def cancel() -> None:
        with database.scope() as other:
            assert finish(other, job_id, owner=None, status=JobStatus.CANCELLED)

    with between_select_and_update(database, cancel), database.scope() as session:
        assert claim_next(session, owner="w1", lease_s=60) is None
    with database.scope() as session:
        assert (get_job(session, job_id).status, get_job(session, job_id).lease_owner) == ("cancelled", None)


def test_a_job_claimed_between_read_and_claim_counts_both_claims(database: Database) -> None:
    with database.scope() as session:
        job_id = enqueue(session, "crawl", {}).id

    def claim_with_a_lease_already_over() -> None:
        with database.scope() as other:
            assert claim_next(other, owner="w0", lease_s=-1).id == job_id

    with between_select_and_update(database, claim_with_a_lease_already_over), database.scope() as session:
        job = claim_next(session, owner="w1", lease_s=60)
        assert job is not None and (job.id, job.lease_owner, job.attempts) == (job_id, "w1", 2)
