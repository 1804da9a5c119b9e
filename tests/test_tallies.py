"""The finished jobs counted per minute and queue by the workers (django_gator.tallies):
what the dashboard's hour chart and the queue figures' last-hour counts read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import DatabaseError, connections
from django.utils.connection import ConnectionDoesNotExist

from django_gator import stats, tallies
from django_gator.admin.dashboard import throughput
from django_gator.models import FinishedTally, Job, JobState
from django_gator.tallies import Tally, finished_since
from django_gator.testing import run_jobs
from tests.conftest import run_worker
from tests.testapp.jobs import Boom, Noop

pytestmark = pytest.mark.django_db(transaction=True)

#: 2026-11-28 10:15:30 UTC, as seconds since the epoch.
T0 = datetime(2026, 11, 28, 10, 15, 30, tzinfo=UTC).timestamp()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def sums() -> dict[str, tuple[int, int]]:
    """Succeeded and dead per queue, over every tally row."""
    out: dict[str, tuple[int, int]] = {}
    for queue, succeeded, dead in FinishedTally.objects.values_list("queue", "succeeded", "dead"):
        s, d = out.get(queue, (0, 0))
        out[queue] = (s + succeeded, d + dead)
    return out


def test_a_tally_counts_successes_and_deaths_by_minute_and_queue_and_nothing_else():
    clock = Clock(T0)
    tally = Tally(clock)
    for state in ("succeeded", "deferred", "dead", "failed", "waiting", "cancelled", None):
        tally.add("default", state)
    clock.now += 40  # the next minute
    tally.add("default", "succeeded")
    tally.add("emails", "dead")

    minute = int(T0 // 60)
    assert tally.pending() == {
        (minute, "default"): [2, 1],  # a deferred success (the batched mark) counts
        (minute + 1, "default"): [1, 0],
        (minute + 1, "emails"): [0, 1],
    }


def test_a_flush_writes_a_row_per_minute_and_queue_and_starts_counting_again():
    clock = Clock(T0)
    tally = Tally(clock)
    tally.add("default", "succeeded")
    tally.add("default", "succeeded")
    clock.now += 60
    tally.add("default", "dead")

    assert tally.flush("default") == 2
    rows = sorted(FinishedTally.objects.values_list("minute", "queue", "succeeded", "dead"))
    assert rows == [
        (datetime(2026, 11, 28, 10, 15, tzinfo=UTC), "default", 2, 0),
        (datetime(2026, 11, 28, 10, 16, tzinfo=UTC), "default", 0, 1),
    ]
    assert tally.pending() == {}
    assert tally.flush("default") == 0
    assert FinishedTally.objects.count() == 2


def test_a_flush_that_fails_keeps_its_counts_for_the_next_one():
    tally = Tally(Clock(T0))
    tally.add("default", "succeeded")
    with connections["default"].cursor() as cursor:
        cursor.execute("DROP TABLE django_gator_finished_tally")
    try:
        with pytest.raises(DatabaseError):
            tally.flush("default")
        tally.add("default", "dead")  # counted meanwhile
        assert tally.pending() == {(int(T0 // 60), "default"): [1, 1]}
    finally:
        from django.db import connection

        with connection.schema_editor() as editor:
            editor.create_model(FinishedTally)
    assert tally.flush("default") == 1
    assert sums() == {"default": (1, 1)}


def test_counts_older_than_two_hours_are_not_kept_when_writes_keep_failing():
    clock = Clock(T0)
    tally = Tally(clock)
    tally.add("default", "succeeded")
    clock.now += tallies.KEPT_SECONDS + 60
    tally.add("default", "dead")
    with pytest.raises(ConnectionDoesNotExist):
        tally.flush("no-such-alias")
    assert tally.pending() == {(int(clock.now // 60), "default"): [0, 1]}


def test_a_heartbeat_whose_tally_write_fails_logs_it_once_a_minute_and_keeps_beating(caplog):
    from django_gator.engines import get_engine
    from django_gator.worker.lifeline import Lifeline

    tally = Tally()
    lifeline = Lifeline(get_engine("default"), "w-tally", tally=tally)
    tally.add("default", "succeeded")
    with connections["default"].cursor() as cursor:
        cursor.execute("DROP TABLE django_gator_finished_tally")
    try:
        with caplog.at_level("ERROR", logger="django_gator.worker"):
            lifeline.flush_tally()
            lifeline.flush_tally()
    finally:
        from django.db import connection

        with connection.schema_editor() as editor:
            editor.create_model(FinishedTally)
    failures = [r for r in caplog.records if "tally failed" in r.getMessage()]
    assert len(failures) == 1, caplog.text
    lifeline.flush_tally()
    assert sums() == {"default": (1, 0)}


def test_rows_older_than_two_hours_are_deleted_as_the_workers_write_theirs(monkeypatch):
    now = datetime.now(UTC)
    old = FinishedTally.objects.create(minute=now - timedelta(hours=3), queue="q", succeeded=5)
    kept = FinishedTally.objects.create(minute=now - timedelta(minutes=90), queue="q", dead=1)
    monkeypatch.setattr(tallies, "_pruned_at", {})

    tally = Tally()
    tally.add("q", "succeeded")
    tally.flush("default")

    assert not FinishedTally.objects.filter(pk=old.pk).exists()
    assert FinishedTally.objects.filter(pk=kept.pk).exists()
    assert sums() == {"q": (1, 1)}
    # Once per PRUNE_EVERY per process: the next flush leaves an old row alone.
    FinishedTally.objects.create(minute=now - timedelta(hours=3), queue="q", succeeded=7)
    tally.add("q", "succeeded")
    tally.flush("default")
    assert sums() == {"q": (9, 1)}


def test_a_worker_counts_what_it_ran_and_the_dashboard_and_queue_figures_read_it():
    Noop.dispatch_many([[] for _ in range(7)])
    Noop.dispatch(queue="emails")
    Boom.dispatch("down")  # no retry policy: dead after one attempt
    Boom.dispatch("down", queue="emails")
    Noop.dispatch(wait=3600)  # not run

    run_worker(concurrency=4)

    assert Job.objects.filter(state=JobState.SUCCEEDED).count() == 8
    assert sums() == {"default": (7, 1), "emails": (1, 1)}
    points = throughput()
    assert len(points) == 60
    assert sum(p["succeeded"] for p in points) == 8
    assert sum(p["dead"] for p in points) == 2
    figures = {q.queue: q for q in stats.queue_stats()}
    assert (figures["default"].succeeded_last_hour, figures["default"].dead_last_hour) == (7, 1)
    assert (figures["emails"].succeeded_last_hour, figures["emails"].dead_last_hour) == (1, 1)


def test_inline_runs_are_counted_at_once():
    Noop.dispatch()
    Boom.dispatch("down")
    run_jobs(raise_errors=False)
    assert sums() == {"default": (1, 1)}


def test_the_hour_chart_reads_only_the_last_sixty_minutes_of_tallies():
    from django_gator.engines import get_engine

    now = get_engine("default").db_now().replace(second=0, microsecond=0)
    FinishedTally.objects.create(minute=now, queue="a", succeeded=3)
    FinishedTally.objects.create(minute=now, queue="b", succeeded=2, dead=1)  # one minute
    FinishedTally.objects.create(minute=now - timedelta(minutes=59), queue="a", dead=4)
    FinishedTally.objects.create(minute=now - timedelta(minutes=60), queue="a", succeeded=100)

    points = throughput()

    assert points[-1] == {"minute": now, "succeeded": 5, "dead": 1}
    assert points[0]["minute"] == now - timedelta(minutes=59)
    assert (points[0]["succeeded"], points[0]["dead"]) == (0, 4)
    assert sum(p["succeeded"] for p in points) == 5
    assert {row[1] for row in finished_since("default", now)} == {"a", "b"}
