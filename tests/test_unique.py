"""Unique jobs: one waiting, failed or running job per job name and key, enforced by the
database's unique index (a partial index on PostgreSQL and SQLite, a virtual column on
MariaDB)."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.db import (
    IntegrityError,
    OperationalError,
    close_old_connections,
    connection,
    connections,
    transaction,
)

from django_gator import Queueable, conf
from django_gator.exceptions import DispatchDeadlock
from django_gator.models import Job, JobState
from tests.conftest import run_worker
from tests.races import race
from tests.testapp.jobs import Record, SyncUser, UniqueReport, refresh_feed
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_second_dispatch_returns_the_waiting_job():
    first = UniqueReport.dispatch(7)
    second = UniqueReport.dispatch(7)
    other = UniqueReport.dispatch(8)

    assert second.pk == first.pk
    assert second.unique_key == first.unique_key
    assert first.unique_key.startswith("sha256:")
    assert other.pk != first.pk
    assert Job.objects.count() == 2


def test_the_default_key_binds_arguments_to_the_handler():
    by_position = UniqueReport.dispatch(7, "month")
    by_keyword = UniqueReport.dispatch(account_id=7)
    by_default = UniqueReport.dispatch(7, period="month")
    other_period = UniqueReport.dispatch(7, period="year")

    assert by_position.pk == by_keyword.pk == by_default.pk
    assert other_period.pk != by_position.pk


def test_unique_key_method_chooses_what_makes_jobs_the_same():
    first = SyncUser.dispatch(1, reason="signup")
    again = SyncUser.dispatch(1, reason="profile edit")
    other = SyncUser.dispatch(2)

    assert again.pk == first.pk
    assert again.kwargs == {"reason": "signup"}  # the existing job, as it was dispatched
    assert first.unique_key == "user:1"
    assert other.unique_key == "user:2"


def test_function_jobs_can_be_unique():
    assert refresh_feed.dispatch(3).pk == refresh_feed.dispatch(3).pk
    assert Job.objects.filter(name=refresh_feed.name).count() == 1


def test_a_finished_job_frees_its_key():
    first = UniqueReport.dispatch(7)
    run_worker()
    assert first.refresh_state() == JobState.SUCCEEDED

    second = UniqueReport.dispatch(7)
    assert second.pk != first.pk
    assert Job.objects.filter(state=JobState.WAITING).count() == 1


def test_running_and_failed_jobs_hold_their_key():
    first = UniqueReport.dispatch(7)
    Job.objects.filter(pk=first.pk).update(
        state=JobState.RUNNING, reserved_by="w", locked_at=first.created_at
    )
    assert UniqueReport.dispatch(7).pk == first.pk
    Job.objects.filter(pk=first.pk).update(state=JobState.FAILED)
    assert UniqueReport.dispatch(7).pk == first.pk
    Job.objects.filter(pk=first.pk).update(state=JobState.DEAD)
    assert UniqueReport.dispatch(7).pk != first.pk


def test_dispatch_many_deduplicates_within_the_batch_and_against_the_table():
    existing = UniqueReport.dispatch(1)
    jobs = UniqueReport.dispatch_many([[1], [2], [2], {"account_id": 3}, [3, "month"]])

    assert jobs[0].pk == existing.pk
    assert jobs[1].pk == jobs[2].pk
    assert jobs[3].pk == jobs[4].pk
    assert len({j.pk for j in jobs}) == 3
    assert Job.objects.count() == 3


def test_the_database_refuses_a_second_active_row_with_the_same_key():
    job = UniqueReport.dispatch(7)
    clone = Job(name=job.name, args=[7], kwargs={}, unique_key=job.unique_key)
    with pytest.raises(IntegrityError), transaction.atomic():
        clone.save()
    # Another job name may use the same key.
    Job.objects.create(name=Record.name, unique_key=job.unique_key)


def test_a_rolled_back_dispatch_frees_the_key():
    with transaction.atomic():
        UniqueReport.dispatch(7)
        transaction.set_rollback(True)
    assert not Job.objects.exists()
    assert UniqueReport.dispatch(7).pk is not None


def test_on_commit_dispatch_fills_in_the_existing_job_on_commit():
    first = UniqueReport.dispatch(7)
    with transaction.atomic():
        deferred = UniqueReport.dispatch(7, on_commit=True)
        assert deferred.pk is None
    assert deferred.pk == first.pk
    assert deferred.state == JobState.WAITING


def test_retrying_a_dead_job_whose_key_is_taken_leaves_it_dead():
    old = UniqueReport.dispatch(7)
    Job.objects.filter(pk=old.pk).update(state=JobState.DEAD)
    new = UniqueReport.dispatch(7)
    other = UniqueReport.dispatch(8)
    Job.objects.filter(pk=other.pk).update(state=JobState.DEAD)

    assert Job.objects.filter(pk__in=[old.pk, other.pk]).retry() == 1
    assert old.refresh_state() == JobState.DEAD
    assert other.refresh_state() == JobState.WAITING
    assert new.refresh_state() == JobState.WAITING


def test_bad_unique_keys_are_refused_with_the_value():
    class BadKey(SyncUser):
        name = "tests.BadKey"

        def unique_key(self, user_id: int, reason: str = "") -> object:
            return user_id  # not a str

    with pytest.raises(TypeError, match=r"BadKey.unique_key\(\) must return a str or None, got 5"):
        BadKey.dispatch(5)

    class LongKey(SyncUser):
        name = "tests.LongKey"

        def unique_key(self, user_id: int, reason: str = "") -> str:
            return "k" * 201

    with pytest.raises(ValueError, match="use 1 to 200 characters"):
        LongKey.dispatch(5)
    assert not Job.objects.exists()


def test_twenty_threads_dispatching_the_same_job_create_one_row():
    barrier = threading.Barrier(20)
    results: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def dispatch() -> None:
        try:
            barrier.wait(timeout=30)
            job = UniqueReport.dispatch(42)
            with lock:
                results.append(job.pk)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            close_old_connections()
            connections[conf.database()].close()

    threads = [threading.Thread(target=dispatch) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert not errors, errors
    assert len(results) == 20
    assert len(set(results)) == 1
    assert Job.objects.filter(name=UniqueReport.name).count() == 1

    run_worker()
    assert Execution.objects.count() == 1


# -- MariaDB: deadlocks -------------------------------------------------------------------


class QuickUnique(Queueable):
    """A unique job that does nothing, so that a worker marks it succeeded at full speed."""

    unique = True
    queue = "unique-stress"

    def handle(self, key: int) -> None:
        return None


@pytest.mark.slow
@pytest.mark.skipif(connection.vendor != "mysql", reason="needs MariaDB or MySQL")
@pytest.mark.parametrize("isolation", ["read committed", "repeatable read"])
def test_unique_dispatch_next_to_a_worker_marking_the_same_keys_never_deadlocks(
    isolation, monkeypatch, caplog
):
    # Four threads dispatch 8 unique keys as fast as they can while a worker claims the jobs
    # and marks them succeeded in batches. The unique lookup used to be a locking read
    # (index entry, then row) and the success mark takes the row, then the index entry:
    # about one dispatch in 300 (and some claims) died with InnoDB's deadlock error 1213.
    # Under READ COMMITTED (Django's default) the lookup takes no lock now; under
    # REPEATABLE READ it still must, and its deadlocks (many more there: gap and AUTO-INC
    # locks of concurrent inserts) are retried by dispatch, whose transaction it is.
    monkeypatch.setitem(connections.settings["default"]["OPTIONS"], "isolation_level", isolation)
    connections["default"].close()  # the next one is opened with that isolation level
    seen = race(QuickUnique, keys=8, seconds=8)
    errors, calls, worker = seen.errors, seen.calls, seen.worker
    assert worker is not None

    assert not errors, f"{len(errors)} of {sum(calls)} dispatches failed, e.g. {errors[:3]}"
    assert sum(calls) > 500, calls
    assert worker.processed > 100, worker.processed
    if isolation == "read committed":
        # Nothing deadlocks at all: the worker's claims (the other victim) do not fail either.
        failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert not failures, failures[:5]
    active = Job.objects.filter(
        name=QuickUnique.name, state__in=[JobState.WAITING, JobState.FAILED, JobState.RUNNING]
    )
    assert active.count() <= 8


#: Whether the caller's connection is at its INSERT (where it waits for the holder).
#: PostgreSQL: a lock it waits for (pg_stat_activity would be read once per transaction).
_CALLER_INSERTING = {
    "mysql": (
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST "
        "WHERE id = %s AND info LIKE 'INSERT INTO%%'"
    ),
    "postgresql": "SELECT COUNT(*) FROM pg_locks WHERE pid = %s AND NOT granted",
}


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has one writer: no deadlock")
def test_a_deadlock_inside_the_callers_transaction_says_to_run_the_block_again():
    # A deadlock is broken by rolling back the caller's whole transaction (InnoDB) or the
    # dispatch's savepoint while the caller's transaction keeps the locks of the cycle
    # (PostgreSQL). Either way only the caller can run its atomic() block again, and
    # dispatch says so. The deadlock is made for real: another transaction holds the key
    # (not yet committed, so our insert waits for it) and then waits for a row the caller
    # updated.
    target = Execution.objects.create(job_id=0, attempt=0, pid=0, label="before")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT CONNECTION_ID()" if connection.vendor == "mysql" else "SELECT pg_backend_pid()"
        )
        [caller_id] = cursor.fetchone()
    holding = threading.Event()
    holder_errors: list[BaseException] = []

    def holder() -> None:
        try:
            with transaction.atomic():
                # Heavier than the caller's transaction, so InnoDB picks the caller as victim.
                # PostgreSQL ends the transaction whose deadlock_timeout runs out first: the
                # holder's is made longer than the caller's.
                if connection.vendor == "postgresql":
                    with connections["default"].cursor() as cursor:
                        cursor.execute("SET LOCAL deadlock_timeout = '20s'")
                for n in range(1, 30):
                    Execution.objects.create(job_id=-n, attempt=0, pid=0)
                QuickUnique.dispatch(99)
                holding.set()
                with connections["default"].cursor() as cursor:
                    # Once the caller runs its INSERT, it has updated the target row: then
                    # each of us waits for the other, whichever asks first.
                    for _ in range(600):
                        cursor.execute(_CALLER_INSERTING[connection.vendor], [caller_id])
                        if cursor.fetchone()[0]:
                            break
                        time.sleep(0.01)
                Execution.objects.filter(pk=target.pk).update(label="holder")
        except BaseException as exc:  # reported below
            holder_errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    assert holding.wait(30)

    def caller() -> None:
        with transaction.atomic():
            Execution.objects.filter(pk=target.pk).update(label="caller")
            QuickUnique.dispatch(99)

    with pytest.raises(DispatchDeadlock, match=r"run the atomic block again") as caught:
        caller()
    thread.join(timeout=60)

    assert not holder_errors, holder_errors
    assert isinstance(caught.value, OperationalError)  # existing handlers still catch it
    assert "QuickUnique" in str(caught.value)
    # The caller's write went with its transaction; the holder's job is the only one.
    assert Execution.objects.get(pk=target.pk).label == "holder"
    assert Job.objects.filter(name=QuickUnique.name).count() == 1
