"""Partitioned storage on PostgreSQL (GATOR_PARTITIONING): the layout, time partitions made
ahead and dropped whole, the default partition that catches rows no partition takes, the
online conversion with a worker running, and the features on it. The rest of the suite runs
on it with GATOR_TEST_PARTITIONING=day (tests/conftest.py)."""

from __future__ import annotations

import itertools
import logging
import re
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_gator.attempts import Mark
from django_gator.engines import get_engine
from django_gator.engines.checks import check_partitioning
from django_gator.engines.partition_conversion import Conversion
from django_gator.engines.partitions import partition_name, slot_start
from django_gator.engines.schema import ERROR_STATISTICS
from django_gator.models import Job, JobState
from django_gator.worker.pruner import Pruner
from django_gator.worker.queues import parse_queue_specs
from django_gator.worker.supervisor import WorkerProcess
from tests.conftest import run_worker, start_worker_thread, wait_for, waiting_on_locks
from tests.testapp.jobs import Boom, Noop, Record, UniqueReport
from tests.testapp.models import Execution

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="partitioned storage is PostgreSQL's"
    ),
]


@pytest.fixture
def partitioned(settings: object) -> Iterator[Conversion]:
    """The jobs table partitioned by day for the test (left so if the suite runs on
    partitioned storage; else converted, and reverted at the end)."""
    settings.GATOR_PARTITIONING = "day"  # type: ignore[attr-defined]
    conversion = Conversion("default")
    converted = not conversion.is_partitioned()
    if converted:
        conversion.convert("day")
        conversion.drop_backup()
    yield conversion
    if converted:
        Job.objects.all().delete()
        conversion.revert()


def partition_of(job_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tableoid::regclass::text FROM django_gator_job WHERE id = %s", [job_id]
        )
        return str(cursor.fetchone()[0])


def finished_job(days_ago: float, state: str = JobState.SUCCEEDED) -> Job:
    return Job.objects.create(
        name=Noop.name, state=state, finished_at=timezone.now() - timedelta(days=days_ago)
    )


def today() -> str:
    return partition_name(slot_start(timezone.now(), "day"))


def test_the_layout_puts_each_state_in_its_partition_and_creates_days_ahead(partitioned):
    assert partitioned.is_partitioned()
    names = [name for name, _, _ in partitioned.sizes()]
    assert {
        "django_gator_job_active",
        "django_gator_job_dead",
        "django_gator_job_done_default",
    } <= set(names)
    starts = [p.start for p in partitioned.time_partitions()]
    first = slot_start(timezone.now(), "day")
    assert [first + timedelta(days=i) for i in range(4)] == [s for s in starts if s >= first][:4]

    done = Noop.dispatch()
    dead = Boom.dispatch()
    run_worker("default")
    waiting = Noop.dispatch()
    assert Job.objects.get(pk=done.pk).state == JobState.SUCCEEDED
    assert partition_of(done.pk) == today()
    assert Job.objects.get(pk=dead.pk).state == JobState.DEAD
    assert partition_of(dead.pk) == "django_gator_job_dead"
    assert partition_of(waiting.pk) == "django_gator_job_active"


def test_a_worker_pass_creates_the_partitions_ahead_and_drops_those_past_retention(
    partitioned, settings
):
    settings.GATOR_PRUNE_SUCCEEDED_AFTER = 7 * 86400
    settings.GATOR_PRUNE_CANCELLED_AFTER = 86400
    now = timezone.now()
    partitioned.ensure_span(now - timedelta(days=12), now, "day")
    old = [finished_job(10), finished_job(9, JobState.CANCELLED), finished_job(8.5)]
    kept = [finished_job(2), finished_job(2, JobState.CANCELLED), Noop.dispatch()]
    dead = finished_job(30, JobState.DEAD)
    ahead = [p for p in partitioned.time_partitions() if p.start > now]
    with connection.cursor() as cursor:
        for part in ahead:
            cursor.execute(f'DROP TABLE "{part.name}"')

    pruner = Pruner(get_engine("default"), "pruner-1")
    assert pruner.prune_once() == 0  # nothing deleted row by row
    assert pruner.partitions_created == len(ahead)
    assert pruner.partitions_dropped >= 3
    assert [p.start for p in partitioned.time_partitions() if p.start > now] == [
        p.start for p in ahead
    ]
    left = set(Job.objects.values_list("id", flat=True))
    assert left == {job.pk for job in kept} | {dead.pk}
    assert not left & {job.pk for job in old}
    oldest = partitioned.time_partitions()[0]
    assert oldest.end > now - timedelta(days=7)  # a partition goes once all of it has expired


def test_a_missing_partition_keeps_the_job_in_the_default_one_and_says_the_fix(partitioned, caplog):
    with connection.cursor() as cursor:
        cursor.execute(f'DROP TABLE "{today()}"')
    job = Noop.dispatch()
    run_worker("default")
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED
    assert partition_of(job.pk) == "django_gator_job_done_default"

    with caplog.at_level(logging.ERROR, logger="django_gator.engines"):
        assert partitioned.check_default() == 1
    assert "gator_partitions --create" in caplog.text

    call_command("gator_partitions", "--create", verbosity=0)
    assert partition_of(job.pk) == today()
    assert partitioned.default_rows() == 0


def test_unique_cancel_retry_and_the_admin_on_partitioned_storage(partitioned, admin_client):
    first = UniqueReport.dispatch(7)
    assert UniqueReport.dispatch(7).pk == first.pk  # one active job per key
    run_worker("default")
    assert Job.objects.get(pk=first.pk).state == JobState.SUCCEEDED
    again = UniqueReport.dispatch(7)  # the finished one holds no key
    assert again.pk != first.pk

    assert again.cancel()
    assert partition_of(again.pk) == today()
    dead = Boom.dispatch()
    run_worker("default")
    assert Job.objects.get(pk=dead.pk).retry()  # an old dead job comes back to the active one
    assert partition_of(dead.pk) == "django_gator_job_active"

    listing = admin_client.get(reverse("admin:django_gator_job_changelist"))
    assert listing.status_code == 200
    for job in (first, again, dead):
        assert f"/{job.pk}/change/" in listing.content.decode()
    detail = admin_client.get(reverse("admin:django_gator_job_change", args=[first.pk]))
    assert detail.status_code == 200


def test_the_online_conversion_loses_no_job_while_a_worker_claims(settings):
    """Jobs in every state, a worker running and a thread dispatching throughout; the
    conversion copies in batches of 25. Every job runs once, none is lost."""
    conversion = Conversion("default")
    if conversion.is_partitioned():
        pytest.skip("the suite runs on partitioned storage already")
    for days in range(40):
        finished_job(days % 5)
    finished_job(3, JobState.DEAD)
    before = [Record.dispatch(f"before-{i}").pk for i in range(100)]
    worker = WorkerProcess(
        parse_queue_specs(["default"]), concurrency=4, install_signal_handlers=False
    )
    thread = start_worker_thread(worker)
    stop = threading.Event()
    during: list[int] = []

    def dispatch() -> None:
        try:
            while not stop.is_set():
                during.append(Record.dispatch(f"during-{len(during)}").pk)
        finally:
            connection.close()

    dispatcher = threading.Thread(target=dispatch)
    dispatcher.start()
    try:
        settings.GATOR_PARTITIONING = "day"
        conversion.convert("day", batch_size=25)
        wait_for(lambda: len(during) > 50)
    finally:
        stop.set()
        dispatcher.join()
    after = [Record.dispatch(f"after-{i}").pk for i in range(20)]
    ids = before + during + after
    try:
        wait_for(lambda: Execution.objects.count() >= len(ids), timeout=60)
    finally:
        worker.request_stop()
        thread.join(30)
    runs = list(Execution.objects.values_list("job_id", flat=True))
    assert sorted(runs) == sorted(ids)  # each once
    assert set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {
        JobState.SUCCEEDED
    }
    assert conversion.is_partitioned()
    assert Job.objects.count() == 41 + len(ids)
    Job.objects.all().delete()
    conversion.revert()
    conversion.drop_backup()


def test_the_check_says_when_the_setting_and_the_table_disagree(settings):
    conversion = Conversion("default")
    settings.GATOR_PARTITIONING = "day" if not conversion.is_partitioned() else None
    [message] = check_partitioning("default", connection)
    assert message.id == "django_gator.W008"
    settings.GATOR_PARTITIONING = "day" if conversion.is_partitioned() else None
    assert check_partitioning("default", connection) == []


def test_a_mark_that_waited_for_a_row_moved_meanwhile_runs_again_and_misses(partitioned):
    """PostgreSQL refuses a statement whose row a concurrent transaction moved to another
    partition (40001) where a plain table would re-check it: the engine runs the mark again,
    which then finds the job no longer running, as on a plain table."""
    engine = get_engine("default")
    Noop.dispatch()
    [claimed] = engine.claim("w1", "default", 1)
    other = connections.create_connection("default")
    other.set_autocommit(False)
    result: list[object] = []

    def mark() -> None:
        try:
            result.append(engine.mark_succeeded("w1", [Mark(claimed.id, claimed.attempts)]))
        except Exception as exc:
            result.append(exc)
        finally:
            connection.close()

    try:
        with other.cursor() as cursor:  # an operator's discard, say: running -> dead
            cursor.execute(
                "UPDATE django_gator_job SET state = 'dead', finished_at = now() WHERE id = %s",
                [claimed.id],
            )
        marker = threading.Thread(target=mark)
        marker.start()
        wait_for(lambda: waiting_on_locks() > 0, interval=0.2)
        other.commit()
        marker.join(30)
    finally:
        other.close()
    assert result == [[]]
    assert Job.objects.get(pk=claimed.id).state == JobState.DEAD
    assert partition_of(claimed.id) == "django_gator_job_dead"


def test_hour_partitions_fill_what_the_day_partitions_leave_without_overlap(partitioned):
    now = timezone.now()
    days = partitioned.time_partitions()
    created = partitioned.ensure(now + timedelta(days=4), "hour", ahead=30)
    parts = partitioned.time_partitions()
    assert len(parts) == len(days) + len(created)
    assert all(p.end - p.start == timedelta(hours=1) for p in parts if p.name in created)
    for before, after in itertools.pairwise(parts):
        assert before.end <= after.start  # no overlap (PostgreSQL would refuse one anyway)
    assert parts[-1].end == slot_start(now + timedelta(days=4), "hour") + timedelta(hours=31)
    job = finished_job(-4.5)  # finished "in 4.5 days": in one of the hour partitions
    assert partition_of(job.pk) in created


def test_the_row_estimate_sums_the_partitions(partitioned):
    from django_gator.stats import estimated_total

    for days in (0, 1, 2):
        finished_job(days)
    finished_job(1, JobState.DEAD)
    Noop.dispatch()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_gator_job")
    assert estimated_total() == (5, False)


def end_triggers() -> list[str]:
    """The end triggers of awaited jobs (migration 0026) and their tables."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname || ' ' || tgrelid::regclass::text FROM pg_trigger"
            " WHERE tgname LIKE 'django_gator_job_%%' AND NOT tgisinternal"
            " AND tgparentid = 0 ORDER BY 1"
        )
        return [row[0] for row in cursor.fetchall()]


PARTITIONED_TRIGGERS = [
    "django_gator_job_arrived django_gator_job",
    "django_gator_job_ended django_gator_job",
]


def test_a_conversion_and_its_revert_keep_the_end_trigger_on_the_jobs_table(partitioned):
    # wait_result() is woken by a trigger on the jobs table: the conversion swaps tables,
    # so it moves the trigger with them (else waiters fell back to a read a second); a
    # job's end moves its row to another partition, which fires INSERT triggers only.
    assert end_triggers() == PARTITIONED_TRIGGERS
    job = Noop.dispatch(1)
    Job.objects.filter(pk=job.pk).update(awaited=True)
    with connection.cursor() as cursor:
        cursor.execute("LISTEN django_gator_ends")
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED, finished_at=timezone.now())
    notices = [n.payload for n in connection.connection.notifies(timeout=5.0, stop_after=1)]
    assert f"j{job.pk}" in notices
    with connection.cursor() as cursor:
        cursor.execute("UNLISTEN *")
    Job.objects.all().delete()
    partitioned.revert()
    assert end_triggers() == ["django_gator_job_ended django_gator_job"]
    partitioned.convert("day")
    partitioned.drop_backup()
    assert end_triggers() == PARTITIONED_TRIGGERS


def statistics_tables() -> list[str]:
    """The tables that hold migration 0030's statistics object (one, unless it was lost)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT stxrelid::regclass::text FROM pg_statistic_ext WHERE stxname = %s",
            [ERROR_STATISTICS],
        )
        return [row[0] for row in cursor.fetchall()]


def test_a_conversion_and_its_revert_keep_the_error_class_statistics_on_the_jobs_table(
    partitioned,
):
    # The statistics object belongs to its table: the conversion would leave it on the
    # kept plain table and a revert would drop it with the partitioned one.
    assert statistics_tables() == ["django_gator_job"]
    Job.objects.all().delete()
    partitioned.revert()
    assert statistics_tables() == ["django_gator_job"]
    partitioned.convert("day")
    partitioned.drop_backup()
    assert statistics_tables() == ["django_gator_job"]


def test_a_statistics_object_of_one_expression_survives_a_revert_and_a_conversion(partitioned):
    # Such an object has no kinds to name: CREATE STATISTICS takes no list for it (with an
    # empty one, `CREATE STATISTICS name () ON ...`, PostgreSQL refuses the statement).
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE STATISTICS gator_test_lower_name ON (lower(name)) FROM django_gator_job"
        )
    try:
        Job.objects.all().delete()
        partitioned.revert()
        partitioned.convert("day")
        partitioned.drop_backup()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT stxrelid::regclass::text FROM pg_statistic_ext WHERE stxname = %s",
                ["gator_test_lower_name"],
            )
            assert [row[0] for row in cursor.fetchall()] == ["django_gator_job"]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP STATISTICS IF EXISTS gator_test_lower_name")


def test_a_workflow_steps_end_is_read_from_the_partition_of_its_time(partitioned):
    # Found by id alone, the settling's read planned every finished jobs' partition (5-11
    # ms a lookup with a day of hourly ones); bounded by the ending transaction's time it
    # plans the partition of now (two within a minute of midnight) and the dead one.
    engine = get_engine("default")
    chain = uuid.uuid4()
    waiting = {"name": Noop.name, "state": JobState.WAITING, "chain_id": chain}
    step = Job.objects.create(**waiting, chain_position=1)
    dead = Job.objects.create(**waiting, chain_position=2)
    earlier = finished_job(days_ago=2)  # a step that ended days ago: another partition
    Job.objects.filter(pk=earlier.pk).update(chain_id=chain, chain_position=3)
    plain = Job.objects.create(name=Noop.name)  # not in a workflow
    ids = [step.pk, dead.pk, earlier.pk, plain.pk]
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        Job.objects.filter(pk__in=[step.pk, plain.pk]).update(
            state=JobState.SUCCEEDED, finished_at=Now()
        )
        Job.objects.filter(pk=dead.pk).update(state=JobState.DEAD, finished_at=Now())
        found = engine.finished_steps(ids)
    assert sorted(found) == [
        (step.pk, chain, 1, JobState.SUCCEEDED, None),
        (dead.pk, chain, 2, JobState.DEAD, None),
    ]
    [read] = [q["sql"] for q in queries.captured_queries if "UNION ALL" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (COSTS OFF) {read}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    scanned = set(re.findall(r" on (django_gator_job_\w+)", plan))
    now = slot_start(timezone.now(), "day")
    near = {partition_name(now + timedelta(days=d)) for d in (-1, 0, 1)}
    assert partition_of(step.pk) in scanned
    assert scanned - near == {"django_gator_job_dead"}, plan
    assert len(scanned) <= 3, plan
