"""Batches: members join inside the block; callbacks once, in the last member's transaction."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

from django_gator import Batch
from django_gator.engines import get_engine
from django_gator.exceptions import JobNotRegistered
from django_gator.models import BatchError, Job, JobState
from django_gator.rows import LostClaim
from django_gator.testing import run_jobs
from tests.conftest import plain_table_only, run_worker
from tests.testapp.jobs import (
    BatchCompleted,
    BatchMemberDead,
    BatchSucceeded,
    Boom,
    Noop,
    Record,
)
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

CALLBACKS = (BatchCompleted.name, BatchSucceeded.name, BatchMemberDead.name)


def callbacks() -> list[str]:
    labels = Execution.objects.order_by("id").values_list("label", flat=True)
    return [label for label in labels if label.split(":")[0] in ("complete", "success", "dead")]


def callback_rows() -> list[Job]:
    return list(Job.objects.filter(name__in=CALLBACKS).order_by("id"))


def new_batch(**kwargs: object) -> Batch:
    options: dict[str, object] = {
        "on_success": BatchSucceeded,
        "on_complete": BatchCompleted,
        "on_dead": BatchMemberDead,
    }
    options.update(kwargs)
    return Batch(**options)


def test_dispatches_inside_the_block_join_and_callbacks_run_once_after_the_last():
    with new_batch(description="album 7") as batch:
        Record.dispatch("one")
        Record.dispatch_many([["two"], ["three"]])
    outside = Record.dispatch("outside")

    assert batch.pk is not None
    assert batch.closed
    members = list(batch.members.order_by("id"))
    assert [m.args for m in members] == [["one"], ["two"], ["three"]]
    assert Job.objects.get(pk=outside.pk).batch_id is None
    assert batch.counts()["waiting"] == 3
    assert callback_rows() == []  # nothing before the members end

    run_jobs()

    assert callbacks() == [f"complete:{batch.pk}", f"success:{batch.pk}"]
    row = Batch.objects.get(id=batch.pk)
    assert row.is_complete
    assert row.completed_at is not None
    assert row.counts() == {**dict.fromkeys(JobState.values, 0), "succeeded": 3, "total": 3}
    assert row.description == "album 7"
    assert row.size == 3
    # The callbacks came after every member's run, and each got the batch id.
    labels = list(Execution.objects.order_by("id").values_list("label", flat=True))
    assert labels.index(f"complete:{batch.pk}") > labels.index("three")
    assert {tuple(r.args) for r in callback_rows()} == {(batch.pk,)}


def test_a_worker_settles_batched_success_marks_once():
    with new_batch() as batch:
        Record.dispatch_many([[f"m{i}"] for i in range(60)])
    run_worker(concurrency=4)
    run_worker()  # the callbacks, if the last mark came after the first worker's last claim
    assert callbacks().count(f"complete:{batch.pk}") == 1
    assert callbacks().count(f"success:{batch.pk}") == 1
    assert Batch.objects.get(pk=batch.pk).counts()["succeeded"] == 60


def test_a_dead_member_dispatches_on_dead_once_and_no_on_success():
    with new_batch() as batch:
        Boom.dispatch()
        Boom.dispatch()
        Noop.dispatch()
    run_jobs(raise_errors=False)
    assert sorted(callbacks()) == sorted([f"dead:{batch.pk}", f"complete:{batch.pk}"])
    counts = Batch.objects.get(pk=batch.pk).counts()
    assert (counts["dead"], counts["succeeded"]) == (2, 1)


def test_retrying_a_dead_member_reopens_the_batch_for_a_new_completion():
    with new_batch() as batch:
        Boom.dispatch()
        Noop.dispatch()
    run_jobs(raise_errors=False)
    assert callbacks().count(f"complete:{batch.pk}") == 1

    # Settling again (any later outcome) repeats nothing.
    get_engine("default").settle_now([batch.pk])
    dead = batch.members.get(state=JobState.DEAD)
    assert Job.objects.filter(pk=dead.pk).retry() == 1
    row = Batch.objects.get(pk=batch.pk)
    assert (row.generation, row.completed_generation, row.is_complete) == (2, 1, False)
    run_jobs(raise_errors=False)  # dead again: a second completion
    assert callbacks().count(f"complete:{batch.pk}") == 2
    assert callbacks().count(f"dead:{batch.pk}") == 1  # the first dead member only
    assert callbacks().count(f"success:{batch.pk}") == 0


def test_a_batch_created_empty_is_extended_then_closed():
    batch = new_batch(description="import")
    first = batch.add(Record, "a")
    batch.add_many(Record, [["b"], ["c"]], queue="bulk")
    assert first.batch_id == batch.pk
    run_jobs()
    assert callbacks() == []  # still open: more may come

    again = Batch.objects.get(id=batch.pk)
    again.add(Record, "d")
    again.close()
    assert callbacks() == []
    run_jobs()
    assert callbacks() == [f"complete:{batch.pk}", f"success:{batch.pk}"]
    with pytest.raises(BatchError, match=rf"batch #{batch.pk} import is closed"):
        again.add(Record, "late")
    with pytest.raises(BatchError, match="is closed"):
        Batch.objects.get(id=batch.pk).add(Record, "late")
    assert not Job.objects.filter(args=["late"]).exists()


def test_closing_a_batch_whose_members_all_ended_dispatches_at_once():
    batch = new_batch()
    batch.add(Noop)
    run_jobs()
    assert callbacks() == []
    batch.close()
    assert [r.name for r in callback_rows()] == [BatchCompleted.name, BatchSucceeded.name]


def test_an_empty_batch_is_refused_and_nothing_is_written():
    with pytest.raises(BatchError, match="is empty"), new_batch(description="nothing"):
        pass
    assert not Batch.objects.exists()
    batch = new_batch()
    with pytest.raises(BatchError, match="is empty"):
        batch.close()
    batch.save()
    with pytest.raises(BatchError, match=rf"batch #{batch.pk} .*is empty"):
        batch.close()
    assert not Batch.objects.get(pk=batch.pk).closed


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (Job, "on_complete=Job is not a registered job class"),
        ("no.such.job", "no.such.job"),
        (42, "on_complete=42 is not a job class"),
    ],
)
def test_a_callback_that_is_not_a_registered_job_is_refused(value, message):
    with pytest.raises(TypeError, match=message):
        Batch(on_complete=value)
    assert not Batch.objects.exists()
    assert not Job.objects.exists()


def test_a_callback_name_close_to_a_registered_one_gets_a_suggestion():
    with pytest.raises(TypeError, match=r"BatchSucceded.*is not registered") as info:
        Batch(on_success=BatchSucceeded.name.replace("Succeeded", "Succeded"))
    assert isinstance(info.value.__cause__, JobNotRegistered)


@override_settings(GATOR_MAX_BATCH_SIZE=5)
def test_more_members_than_the_limit_are_refused_and_nothing_is_inserted():
    too_many = r"6 members, more than GATOR_MAX_BATCH_SIZE = 5"
    with pytest.raises(BatchError, match=too_many), new_batch():
        Noop.dispatch_many([[]] * 6)
    assert not Job.objects.exists()
    assert not Batch.objects.exists()

    batch = new_batch()
    batch.add_many(Noop, [[]] * 4)
    # Another process's view of the same batch: the row's count decides.
    other = Batch.objects.get(pk=batch.pk)
    other.size = 0
    with pytest.raises(BatchError, match=r"6 members, more than GATOR_MAX_BATCH_SIZE = 5"):
        other.add_many(Noop, [[]] * 2)
    assert Job.objects.count() == 4


def test_cancelling_the_last_members_completes_the_batch():
    with new_batch():
        Noop.dispatch()
        waiting = Noop.dispatch(wait=timedelta(hours=1))
    run_jobs()
    assert callbacks() == []
    assert waiting.cancel()
    assert [r.name for r in callback_rows()] == [BatchCompleted.name]


def test_discarding_a_failed_member_completes_the_batch():
    with new_batch() as batch:
        failed = Record.dispatch("x")
    Job.objects.filter(pk=failed.pk).update(state=JobState.FAILED)
    assert Job.objects.filter(pk=failed.pk).discard(by="test") == 1
    assert [r.name for r in callback_rows()] == [BatchCompleted.name]
    assert Batch.objects.get(pk=batch.pk).is_complete


def test_a_rescue_to_dead_settles_the_batch():
    engine = get_engine("default")
    with new_batch() as batch:
        member = Noop.dispatch()
    engine.register_worker("lost", "host", 1, '["default"]', 1)
    claimed = engine.claim_by_id("lost", member.pk)
    assert claimed is not None
    assert claimed.batch_id == batch.pk
    lost = LostClaim(member.pk, claimed.attempts, "lost", 0, False, 0)
    cutoff = engine.db_now() + timedelta(seconds=1)
    assert engine.rescue(lost, cutoff, dead=True, error="{}", last_error="WorkerLost")
    assert [r.name for r in callback_rows()] == [BatchMemberDead.name, BatchCompleted.name]


def test_dispatch_on_commit_joins_and_the_close_follows_the_commit():
    with transaction.atomic():
        with new_batch() as batch:
            Record.dispatch("deferred", on_commit=True)
        assert batch.pk is None  # the members and the batch wait for the commit
    assert batch.closed
    assert batch.members.count() == 1
    run_jobs()
    assert callbacks() == [f"complete:{batch.pk}", f"success:{batch.pk}"]


def test_contexts_do_not_leak_between_threads():
    seen: list[int | None] = []

    def dispatch() -> None:
        try:
            seen.append(Noop.dispatch().batch_id)
        finally:
            connections.close_all()

    with new_batch() as batch:
        Noop.dispatch()
        thread = threading.Thread(target=dispatch)
        thread.start()
        thread.join()
    assert seen == [None]
    assert batch.members.count() == 1


#: The statements that read a batch's members: the completion check (and a workflow
#: step's probe), the admin page's counts, and the pruning of finished batches.
MEMBER_QUERIES = [
    "SELECT id FROM django_gator_job WHERE batch_id = %s "
    "AND state IN ('waiting', 'failed', 'running') LIMIT 1",
    "SELECT id FROM django_gator_job WHERE batch_id = %s AND state = 'dead' LIMIT 1",
    "SELECT state, COUNT(id) FROM django_gator_job WHERE batch_id = %s GROUP BY state",
    "SELECT b.id FROM django_gator_batch b WHERE b.id > %s AND NOT EXISTS "
    "(SELECT 1 FROM django_gator_job j WHERE j.batch_id = b.id)",
]


@pytest.mark.parametrize("sql", MEMBER_QUERIES)
def test_the_members_are_read_through_the_batch_index(sql):
    """PostgreSQL and SQLite: through the partial index of batch members (migration
    0017); MariaDB/MySQL: through 0012's index of every row (FORCE INDEX names it)."""
    with new_batch() as batch:
        Noop.dispatch_many([[]] * 3)
    # Not members (no entry in the partial index), a quarter of them dead, as on a site
    # where dead jobs wait for an operator (the dead-job screen's index holds those).
    others = [job.pk for job in Noop.dispatch_many([[]] * 2000)]
    Job.objects.filter(pk__in=others[:500]).update(state=JobState.DEAD)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ANALYZE django_gator_job")
            cursor.execute("EXPLAIN " + sql, [batch.pk])
            plan = " ".join(r[0] for r in cursor.fetchall())
            cursor.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'django_gator_job'"
            )
            defs = dict(cursor.fetchall())
            assert "WHERE (batch_id IS NOT NULL)" in defs["gator_job_batch_member"]
            assert "gator_job_batch" not in defs
        elif connection.vendor == "sqlite":
            cursor.execute("ANALYZE")
            cursor.execute("EXPLAIN QUERY PLAN " + sql, [batch.pk])
            plan = " ".join(str(r[-1]) for r in cursor.fetchall())
            cursor.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'")
            defs = dict(cursor.fetchall())
            assert 'WHERE "batch_id" IS NOT NULL' in defs["gator_job_batch_member"]
            assert "gator_job_batch" not in defs
        else:
            cursor.execute("ANALYZE TABLE django_gator_job")
            cursor.fetchall()
            cursor.execute("EXPLAIN " + sql, [batch.pk])
            plan = " ".join(str(r) for r in cursor.fetchall())
    expected = "gator_job_batch" if connection.vendor == "mysql" else "gator_job_batch_member"
    assert expected in plan, plan


@plain_table_only
def test_the_partial_batch_index_migrates_back_and_forth():
    from django.core.management import call_command

    def names() -> set[str]:
        with connection.cursor() as cursor:
            return set(connection.introspection.get_constraints(cursor, "django_gator_job"))

    call_command("migrate", "django_gator", "0016", verbosity=0)
    try:
        assert "gator_job_batch" in names()
        assert "gator_job_batch_member" not in names()
    finally:
        call_command("migrate", "django_gator", verbosity=0)
    if connection.vendor == "mysql":
        assert "gator_job_batch" in names()
    else:
        assert "gator_job_batch_member" in names()
        assert "gator_job_batch" not in names()


@override_settings(GATOR_IMMEDIATE=True)
def test_immediate_mode_runs_the_callbacks_too():
    with new_batch() as batch:  # members run at dispatch; the close completes the batch
        Record.dispatch("now")
    assert callbacks() == [f"complete:{batch.pk}", f"success:{batch.pk}"]

    with transaction.atomic(), new_batch() as later:  # closed before its members run
        Record.dispatch("on commit")
    assert callbacks()[-2:] == [f"complete:{later.pk}", f"success:{later.pk}"]
