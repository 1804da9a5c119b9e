"""The engines' claim and compare-and-set statements, and their plans, on each database."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from django_gator.attempts import Claim, Mark
from django_gator.engines import get_engine
from django_gator.models import Job, JobState
from tests.testapp.jobs import (
    Echo,
)
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def test_outcome_writes_are_compare_and_set_on_the_claim():
    engine = get_engine("default")
    job = Echo.dispatch("cas")
    [claim] = engine.claim("worker-a", "echo", 10)
    assert claim.attempts == 1

    # Another worker, or a stale attempt number, cannot write this claim's outcome.
    assert engine.mark_succeeded("worker-b", [Mark(claim.id, claim.attempts, None)]) == []
    assert engine.mark_succeeded("worker-a", [Mark(claim.id, claim.attempts + 1, None)]) == []
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    assert engine.mark_succeeded("worker-a", [Mark(claim.id, claim.attempts, '"ok"')]) == [job.pk]
    # Once written, the same write does nothing a second time.
    assert engine.mark_succeeded("worker-a", [Mark(claim.id, claim.attempts, '"ok"')]) == []
    job.refresh_from_db()
    assert (job.state, job.result) == (JobState.SUCCEEDED, "ok")


def test_a_claim_is_never_handed_out_twice():
    engine = get_engine("default")
    Echo.dispatch_many([[i] for i in range(5)])

    first = engine.claim("worker-a", "echo", 3)
    second = engine.claim("worker-b", "echo", 10)

    assert len(first) == 3
    assert len(second) == 2
    assert not {j.id for j in first} & {j.id for j in second}
    assert engine.claim("worker-c", "echo", 10) == []


def test_released_claims_go_back_to_waiting_without_charging_the_attempt():
    engine = get_engine("default")
    job = Echo.dispatch("release")
    [claim] = engine.claim("worker-a", "echo", 1)

    assert engine.release("worker-a", [Claim(claim.id, claim.attempts)]) == [job.pk]

    job.refresh_from_db()
    assert (job.state, job.attempts, job.started_at) == (JobState.WAITING, 0, None)
    [again] = engine.claim("worker-b", "echo", 1)
    assert again.attempts == 1


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_postgres_claim_uses_the_partial_ready_index():
    Echo.dispatch_many([[i] for i in range(50)])
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        cursor.execute(
            "EXPLAIN SELECT id FROM django_gator_job WHERE queue = 'echo' AND "
            "state IN ('waiting', 'failed') AND concurrency_key IS NULL "
            "AND next_execution_at <= statement_timestamp() "
            "ORDER BY priority DESC, next_execution_at, id LIMIT 10 FOR UPDATE SKIP LOCKED"
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET enable_seqscan")
    assert "gator_job_ready" in plan
    assert "Sort" not in plan


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_postgres_claim_and_batched_mark_are_prepared_once_per_connection(settings):
    """The claim and the batched success mark are parsed and planned once per connection
    (server-side prepared statements), and behave the same whether prepared or not; behind
    a transaction pooler nothing is prepared."""
    engine = get_engine("default")

    def prepared() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            return [row[0] for row in cursor.fetchall()]

    def drain() -> None:
        Echo.dispatch_many([[i] for i in range(6)])
        for _ in range(3):  # the same statements, run again on the same connection
            claimed = engine.claim("worker-p", "echo", 2)
            assert len(claimed) == 2
            marks = [Mark(j.id, j.attempts, '"ok"') for j in claimed]
            assert sorted(engine.mark_succeeded("worker-p", marks)) == sorted(j.id for j in claimed)
        assert engine.claim("worker-p", "echo", 2) == []

    try:
        connection.close()
        settings.GATOR_POOLED_DATABASES = []
        drain()
        statements = prepared()
        assert len(statements) == 2, statements  # one claim, one mark, each prepared once
        assert any("FOR UPDATE SKIP LOCKED" in s for s in statements), statements
        assert any("unnest" in s and "succeeded" in s for s in statements), statements
        assert connection.connection.prepare_threshold is None  # left as Django set it
        assert Job.objects.filter(queue="echo", state=JobState.SUCCEEDED, result="ok").count() == 6

        connection.close()
        settings.GATOR_POOLED_DATABASES = ["default"]
        drain()
        assert prepared() == []
    finally:
        connection.close()


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_postgres_writes_the_success_marks_in_the_claim_statement():
    """claim_and_mark() is one statement: each mark is still a compare-and-set on its
    claim, and the marks are written even when the claim finds nothing."""
    from django.test.utils import CaptureQueriesContext

    from django_gator.engines.core import Position

    engine = get_engine("default")
    Echo.dispatch_many([[i] for i in range(5)])
    mine = engine.claim("worker-a", "echo", 2)
    [theirs] = engine.claim("worker-b", "echo", 1)
    marks = [Mark(j.id, j.attempts, '"ok"') for j in mine]
    stale = Mark(theirs.id, theirs.attempts, None)  # not worker-a's claim

    with CaptureQueriesContext(connection) as captured:
        claimed, written = engine.claim_and_mark("worker-a", "echo", 5, [*marks, stale])

    assert len(captured.captured_queries) == 1
    assert sorted(written) == sorted(j.id for j in mine)
    assert len(claimed) == 2
    assert all(j.attempts == 1 and j.args in ([3], [4]) for j in claimed)
    states = dict(Job.objects.values_list("id", "state"))
    assert {states[j.id] for j in mine} == {JobState.SUCCEEDED}
    assert states[theirs.id] == JobState.RUNNING
    assert {states[j.id] for j in claimed} == {JobState.RUNNING}

    after = Position({0: (claimed[-1].next_execution_at, claimed[-1].id)}, 1.0)
    nothing, written = engine.claim_and_mark(
        "worker-a", "echo", 5, [Mark(j.id, j.attempts, None) for j in claimed], after=after
    )
    assert nothing == []
    assert sorted(written) == sorted(j.id for j in claimed)
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() == 4


@pytest.mark.skipif("connection.vendor != 'mysql'")
def test_mysql_claim_walks_the_ready_index_in_order():
    Echo.dispatch_many([[i] for i in range(50)])
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN SELECT id FROM django_gator_job FORCE INDEX (gator_job_ready_my) "
            "WHERE queue = 'echo' AND ready_rank IS NOT NULL AND "
            "next_execution_at <= UTC_TIMESTAMP(6) ORDER BY ready_rank, next_execution_at, id "
            "LIMIT 10 FOR UPDATE SKIP LOCKED"
        )
        columns = [c[0] for c in cursor.description]
        [row] = [dict(zip(columns, r, strict=True)) for r in cursor.fetchall()]
    assert row["key"] == "gator_job_ready_my"
    assert "filesort" not in (row["Extra"] or "")


@pytest.mark.skipif("connection.vendor != 'sqlite'")
def test_sqlite_claim_uses_the_partial_ready_index():
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM django_gator_job WHERE queue = 'echo' AND "
            "state IN ('waiting', 'failed') AND concurrency_key IS NULL "
            "AND next_execution_at <= '2100-01-01' "
            "ORDER BY priority DESC, next_execution_at, id LIMIT 10"
        )
        plan = " ".join(str(row[-1]) for row in cursor.fetchall())
    assert "gator_job_ready" in plan
    assert "TEMP B-TREE" not in plan


@pytest.mark.skipif("connection.vendor == 'sqlite'")
def test_a_settling_write_that_loses_a_deadlock_runs_again_by_itself():
    # The worker's writes that may end a workflow step run through with_steps() in a
    # transaction of their own. Two of them lock two rows in opposite orders: the database
    # ends one to break the deadlock (InnoDB error 1213, PostgreSQL 40P01), and with_steps
    # runs that one again from the start (its write is a compare-and-set), so neither
    # caller sees the error.
    rows = [
        Execution.objects.create(job_id=-n, attempt=0, pid=0, label=f"row {n}").pk for n in range(2)
    ]
    job = Echo.dispatch("deadlock")  # not a step: settling it changes nothing
    engine = get_engine("default")
    both_hold_one = threading.Barrier(2, timeout=30)
    calls = [0, 0]
    errors: list[BaseException] = []

    def write(me: int) -> int:
        calls[me] += 1
        first, second = rows if me == 0 else rows[::-1]
        Execution.objects.filter(pk=first).update(label=f"locked by {me}")
        if calls[me] == 1:
            both_hold_one.wait()
        Execution.objects.filter(pk=second).update(label=f"written by {me}")
        return 1

    def run(me: int) -> None:
        try:
            assert engine.with_steps([job.pk], None, lambda: write(me)) == 1
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()  # this thread's

    threads = [threading.Thread(target=run, args=(me,)) for me in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert not errors, errors
    assert sorted(calls) == [1, 2], calls  # one lost the deadlock and ran again
    labels = set(Execution.objects.filter(pk__in=rows).values_list("label", flat=True))
    loser = calls.index(2)
    assert labels == {f"written by {loser}", f"locked by {loser}"}  # the rerun wrote last
