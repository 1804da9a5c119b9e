"""Windows on a unique key: ``unique_for`` (the key stays taken after the job finished),
``debounce`` (the last call within the window wins) and ``throttle`` (one start per key per
window), kept by the database's indexes under concurrent dispatchers."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import close_old_connections, connections

from django_gator import Queueable, conf
from django_gator.dbtime import DbNow
from django_gator.engines import get_engine
from django_gator.models import Job, JobState
from tests.conftest import run_worker
from tests.races import race

pytestmark = pytest.mark.django_db(transaction=True)


class Webhook(Queueable):
    """An idempotency key a webhook handler dispatches blindly."""

    queue = "windows"
    unique_for = timedelta(hours=1)

    def unique_key(self, event_id: str, payload: Any = None) -> str:
        return f"event:{event_id}"

    def handle(self, event_id: str, payload: Any = None) -> None:
        return None


class Reindex(Queueable):
    queue = "windows"
    debounce = 30

    def unique_key(self, document_id: int, revision: int = 0) -> str:
        return f"doc:{document_id}"

    def handle(self, document_id: int, revision: int = 0) -> None:
        return None


class Digest(Queueable):
    queue = "windows"
    unique = True
    throttle = 10

    def handle(self, user_id: int) -> None:
        return None


def _in_threads(count: int, work: Callable[[int], Job]) -> list[Job]:
    """``work(i)`` in ``count`` threads released together; their jobs, or the first error."""
    barrier = threading.Barrier(count)
    results: list[Job] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            job = work(index)
            with lock:
                results.append(job)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            close_old_connections()
            connections[conf.database()].close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert len(results) == count
    return results


def _claim(queue: str = "windows") -> list[Any]:
    return get_engine(conf.database()).claim("test-worker", queue, 10)


# -- class definitions ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attributes", "error", "message"),
    [
        ({"debounce": 30}, TypeError, r"Bad\.debounce applies per unique key.*unique = True"),
        ({"throttle": 5}, TypeError, r"Bad\.throttle applies per unique key"),
        ({"unique_for": 60}, TypeError, r"Bad\.unique_for applies per unique key"),
        (
            {"unique": True, "debounce": 3, "throttle": 4},
            TypeError,
            r"Bad sets debounce and throttle",
        ),
        ({"unique": True, "debounce": 0}, ValueError, r"Bad\.debounce must be positive.*0"),
        ({"unique": True, "throttle": True}, ValueError, r"Bad\.throttle must be a timedelta"),
        ({"expires": "10m"}, ValueError, r"Bad\.expires must be a timedelta.*'10m'"),
        ({"expires": timedelta(0)}, ValueError, r"Bad\.expires must be positive"),
    ],
)
def test_nonsensical_windows_are_refused_when_the_class_is_defined(attributes, error, message):
    def handle(self: Any) -> None:
        return None

    with pytest.raises(error, match=message):
        type("Bad", (Queueable,), {**attributes, "handle": handle, "__module__": __name__})


def test_the_traits_carry_the_window():
    assert Webhook.traits.window == ("unique_for", 3600.0)
    assert Reindex.traits.window == ("debounce", 30.0)
    assert Digest.traits.window == ("throttle", 10.0)


# -- unique_for ----------------------------------------------------------------------------


def test_unique_for_keeps_the_key_after_the_job_finished():
    first = Webhook.dispatch("evt_1", {"amount": 5})
    assert (first.unique_key, first.dedupe_key) == ("event:evt_1", "event:evt_1")
    while_waiting = Webhook.dispatch("evt_1", {"amount": 5})
    assert while_waiting.pk == first.pk

    run_worker("windows")
    assert first.refresh_state() == JobState.SUCCEEDED
    after = Webhook.dispatch("evt_1", {"amount": 999})
    assert after.pk == first.pk
    assert after.state == JobState.SUCCEEDED
    assert after.args == ["evt_1", {"amount": 5}]  # the job as it was dispatched
    assert Job.objects.filter(name=Webhook.name).count() == 1

    # An hour and a bit later (the finish moved back, as time would have):
    Job.objects.filter(pk=first.pk).update(finished_at=DbNow() - timedelta(minutes=61))
    fresh = Webhook.dispatch("evt_1")
    assert fresh.pk != first.pk
    assert fresh.state == JobState.WAITING


def test_unique_for_counts_dead_and_cancelled_jobs_as_finished():
    job = Webhook.dispatch("evt_2")
    job.cancel()
    assert Webhook.dispatch("evt_2").pk == job.pk


def test_unique_for_with_twenty_concurrent_dispatchers():
    fresh = _in_threads(20, lambda i: Webhook.dispatch("evt_fresh", {"n": i}))
    assert len({job.pk for job in fresh}) == 1
    run_worker("windows")
    assert Job.objects.get(pk=fresh[0].pk).state == JobState.SUCCEEDED

    again = _in_threads(20, lambda i: Webhook.dispatch("evt_fresh", {"n": i}))
    assert {job.pk for job in again} == {fresh[0].pk}
    assert Job.objects.filter(name=Webhook.name).count() == 1


def test_a_job_finished_between_the_look_and_the_insert_is_found_after_it():
    # The look before the INSERT saw nothing (the other job finished just then): the look
    # after the INSERT, in its savepoint, finds the finished job and our row is undone.
    other = Webhook.dispatch("evt_3")
    Job.objects.filter(pk=other.pk).update(state=JobState.SUCCEEDED, finished_at=DbNow())
    engine = get_engine(conf.database())
    from django_gator.rows import InsertRow
    from django_gator.windows import Window

    row = InsertRow(Webhook.name, '["evt_3"]', "{}", "windows", 0, None, unique_key="event:evt_3")
    found = engine._holder(row, 3600.0, finished_only=True)  # type: ignore[attr-defined]
    assert found is not None
    assert found[0] == other.pk
    [(job_id, _, _, created)] = engine.insert_windowed([row], Window("unique_for", 3600.0))
    assert (job_id, created) == (other.pk, False)
    assert Job.objects.filter(name=Webhook.name).count() == 1


# -- debounce ------------------------------------------------------------------------------


def test_debounce_replaces_the_waiting_jobs_arguments_and_pushes_its_start_back():
    first = Reindex.dispatch(7, revision=1)
    now = get_engine(conf.database()).db_now()
    assert (first.dedupe_key, first.unique_key) == ("doc:7", None)
    assert timedelta(seconds=25) < first.next_execution_at - now <= timedelta(seconds=31)

    second = Reindex.dispatch(7, revision=2)
    assert second.pk == first.pk
    assert second.kwargs == {"revision": 2}
    assert second.next_execution_at >= first.next_execution_at
    assert Job.objects.get(pk=first.pk).kwargs == {"revision": 2}
    assert Reindex.dispatch(8).pk != first.pk


def test_debounce_puts_a_new_job_beside_a_running_one():
    first = Reindex.dispatch(9, revision=1)
    Job.objects.filter(pk=first.pk).update(next_execution_at=DbNow())
    [claimed] = _claim()
    assert claimed.id == first.pk
    later = Reindex.dispatch(9, revision=2)
    assert later.pk != first.pk
    assert later.kwargs == {"revision": 2}
    assert Reindex.dispatch(9, revision=3).pk == later.pk


def test_debounce_refuses_wait_and_at():
    with pytest.raises(ValueError, match=r"Reindex\.debounce sets when its jobs start"):
        Reindex.dispatch(1, wait=60)
    assert not Job.objects.exists()


def test_debounce_with_twenty_concurrent_dispatchers_leaves_one_waiting_job():
    jobs = _in_threads(20, lambda i: Reindex.dispatch(11, revision=i))
    assert len({job.pk for job in jobs}) == 1
    [row] = Job.objects.filter(name=Reindex.name)
    assert row.state == JobState.WAITING
    assert row.kwargs["revision"] in range(20)
    # The row holds the arguments of the dispatch that committed last: every dispatch
    # returned the job as it left it, and exactly one of them saw its own arguments last.
    assert row.kwargs in [job.kwargs for job in jobs]


# -- throttle ------------------------------------------------------------------------------


def test_throttle_coalesces_into_the_waiting_job_and_spaces_starts():
    first = Digest.dispatch(5)
    assert Digest.dispatch(5).pk == first.pk  # coalesced while it waits
    [claimed] = _claim()
    assert claimed.id == first.pk
    started = Job.objects.get(pk=first.pk).started_at

    second = Digest.dispatch(5)
    assert second.pk != first.pk
    assert second.next_execution_at >= started + timedelta(seconds=10)
    assert Digest.dispatch(5).pk == second.pk
    assert _claim() == []  # not before the window ends
    assert Digest.dispatch(6).next_execution_at < second.next_execution_at


def test_throttle_with_twenty_concurrent_dispatchers():
    first = Digest.dispatch(12)
    [claimed] = _claim()
    assert claimed.id == first.pk
    started = Job.objects.get(pk=first.pk).started_at
    jobs = _in_threads(20, lambda i: Digest.dispatch(12))
    assert len({job.pk for job in jobs}) == 1
    waiting = Job.objects.get(name=Digest.name, state=JobState.WAITING)
    assert waiting.next_execution_at >= started + timedelta(seconds=10)
    assert Job.objects.filter(name=Digest.name).count() == 2


def test_immediate_mode_leaves_debounced_and_throttled_jobs_for_their_window(settings):
    settings.GATOR_IMMEDIATE = True
    debounced = Reindex.dispatch(21)
    throttled = Digest.dispatch(21)
    kept = Webhook.dispatch("evt_immediate")
    states = dict(Job.objects.values_list("pk", "state"))
    assert states[debounced.pk] == JobState.WAITING
    assert states[throttled.pk] == JobState.WAITING
    assert states[kept.pk] == JobState.SUCCEEDED


class QuickDigest(Queueable):
    """Throttled to one start per half second per key, and does nothing."""

    queue = "windows-stress"
    unique = True
    throttle = 0.5

    def handle(self, key: int) -> None:
        return None


@pytest.mark.slow
def test_throttled_starts_are_spaced_while_dispatchers_and_a_worker_race():
    # Four threads dispatch three keys as fast as they can for four seconds while a worker
    # claims them: every key's jobs start at least the window apart (database time), and
    # no dispatch fails (a deadlock is retried in the dispatch's own transaction).
    seen = race(QuickDigest, keys=3, seconds=4)
    errors, calls = seen.errors, seen.calls

    assert not errors, f"{len(errors)} of {sum(calls)} dispatches failed, e.g. {errors[:3]}"
    assert sum(calls) > 50, calls
    started = Job.objects.filter(name=QuickDigest.name, started_at__isnull=False)
    assert started.count() >= 6  # each key started more than once in four seconds
    for key in {job.dedupe_key for job in started}:
        times = sorted(started.filter(dedupe_key=key).values_list("started_at", flat=True))
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
        assert min(gaps) >= 0.5 - 0.002, (key, gaps)  # a datetime's text on SQLite: ms
    waiting = Job.objects.filter(name=QuickDigest.name, state=JobState.WAITING)
    assert waiting.count() <= 3


@pytest.mark.skipif(connections["default"].vendor != "mysql", reason="needs MariaDB or MySQL")
def test_windows_under_repeatable_read_on_mariadb(monkeypatch):
    # Under REPEATABLE READ a plain read sees the transaction's snapshot: the looks of the
    # windows are locking reads there, and a deadlock is retried by the dispatch.
    monkeypatch.setitem(
        connections.settings["default"]["OPTIONS"], "isolation_level", "repeatable read"
    )
    connections["default"].close()
    debounced = _in_threads(20, lambda i: Reindex.dispatch(31, revision=i))
    assert len({job.pk for job in debounced}) == 1
    first = Digest.dispatch(31)
    [claimed] = _claim()
    assert claimed.id == first.pk
    throttled = _in_threads(20, lambda i: Digest.dispatch(31))
    assert len({job.pk for job in throttled}) == 1
    kept = _in_threads(20, lambda i: Webhook.dispatch("evt_rr"))
    assert len({job.pk for job in kept}) == 1
    connections["default"].close()


class SometimesKept(Queueable):
    """unique_key() returns None for 0: that dispatch is not unique, and has no window."""

    queue = "windows"
    unique_for = 60

    def unique_key(self, n: int) -> str | None:
        return None if n == 0 else f"k{n}"

    def handle(self, n: int) -> None:
        return None


class SometimesUnique(SometimesKept):
    unique_for = None
    unique = True


@pytest.mark.parametrize("job_class", [SometimesUnique, SometimesKept])
def test_rows_without_a_key_in_one_dispatch_many_are_each_inserted(job_class):
    jobs = job_class.dispatch_many([[0], [0], [1], [1]])
    assert jobs[0].pk != jobs[1].pk
    assert jobs[2].pk == jobs[3].pk
    assert Job.objects.filter(name=job_class.name).count() == 3
