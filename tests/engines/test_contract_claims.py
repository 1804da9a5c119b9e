"""The contract's claims: what a claim takes, that no two claims take the same row (a real
second connection), its round trips, and the reads around it."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from django_gator import pause_queue
from django_gator.attempts import Claim, Mark
from django_gator.engines import get_engine
from django_gator.engines.core import Position
from django_gator.models import Job, JobState
from tests.engines.conformance import covers, statements, writes
from tests.testapp.jobs import Echo, Noop

pytestmark = pytest.mark.django_db(transaction=True)


@covers("claim_and_mark")
def test_a_claim_takes_due_jobs_highest_priority_first_and_charges_an_attempt():
    engine = get_engine("default")
    low = Echo.dispatch("low", priority=1)
    high = Echo.dispatch("high", priority=9)
    Echo.dispatch("later", wait=timedelta(hours=1))
    Noop.dispatch()  # another queue

    claimed, written = engine.claim_and_mark("worker-a", "echo", 10, [])

    assert written == []
    assert [j.id for j in claimed] == [high.pk, low.pk]
    assert [(j.attempts, j.args, j.queue) for j in claimed] == [
        (1, ["high"], "echo"),
        (1, ["low"], "echo"),
    ]
    rows = Job.objects.filter(pk__in=[low.pk, high.pk])
    assert {(r.state, r.attempts, r.reserved_by) for r in rows} == {
        (JobState.RUNNING, 1, "worker-a")
    }
    assert engine.claim_and_mark("worker-b", "echo", 10, [])[0] == []  # taken, or not due


@covers("claim_and_mark")
def test_a_claim_of_a_paused_queue_takes_nothing():
    engine = get_engine("default")
    Echo.dispatch("paused")
    pause_queue("echo")
    assert engine.claim_and_mark("worker-a", "echo", 10, []) == ([], [])
    assert Job.objects.get().state == JobState.WAITING


@hsettings(
    max_examples=8, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    jobs=st.integers(1, 30),
    limits=st.lists(st.integers(1, 5), min_size=2, max_size=4),
)
@covers("claim_and_mark")
def test_concurrent_claims_never_hand_a_job_to_two_workers(jobs: int, limits: list[int]) -> None:
    """Workers on their own connections claim at once until nothing is left: every job is
    claimed exactly once, by the worker its row names."""
    Job.objects.all().delete()
    engine = get_engine("default")
    ids = {job.pk for job in Noop.dispatch_many([[]] * jobs, queue="race")}
    got: dict[str, list[int]] = {}
    failures: list[BaseException] = []
    start = threading.Barrier(len(limits))

    def work(worker: str, limit: int) -> None:
        mine = got.setdefault(worker, [])
        try:
            start.wait(timeout=30)
            while batch := engine.claim_and_mark(worker, "race", limit, [])[0]:
                mine += [job.id for job in batch]
        except BaseException as exc:
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=work, args=(f"racer-{i}", limit)) for i, limit in enumerate(limits)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    everything = [job_id for claimed in got.values() for job_id in claimed]
    assert sorted(everything) == sorted(ids), "a job was claimed twice, or never"
    assert engine.claim_and_mark("late", "race", 10, []) == ([], [])
    owners = dict(Job.objects.filter(pk__in=ids).values_list("pk", "reserved_by"))
    for worker, claimed in got.items():
        assert all(owners[job_id] == worker for job_id in claimed)
    assert set(Job.objects.filter(pk__in=ids).values_list("state", "attempts")) == {("running", 1)}


@pytest.mark.skipif("connection.vendor == 'sqlite'", reason="SQLite's writer waits instead")
@covers("claim_and_mark")
def test_a_claim_skips_the_row_another_uncommitted_claim_holds():
    """Another connection's claim, not yet committed, holds its row: this claim neither
    waits for it nor returns it (SKIP LOCKED), and the other claim keeps it."""
    engine = get_engine("default")
    jobs = Echo.dispatch_many([[i] for i in range(3)])
    holding, release = threading.Event(), threading.Event()
    held: list[int] = []
    errors: list[BaseException] = []

    def other() -> None:
        try:
            with transaction.atomic():
                claimed, _ = engine.claim_and_mark("worker-other", "echo", 1, [])
                held.extend(j.id for j in claimed)
                holding.set()
                assert release.wait(timeout=60)
        except BaseException as exc:  # reported below
            errors.append(exc)
            holding.set()
        finally:
            connections.close_all()

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert holding.wait(timeout=60)
        claimed, _ = engine.claim_and_mark("worker-me", "echo", 10, [])
    finally:
        release.set()
        thread.join(timeout=60)

    assert not errors, errors
    assert held == [jobs[0].pk]
    assert sorted(j.id for j in claimed) == [jobs[1].pk, jobs[2].pk]
    assert Job.objects.get(pk=jobs[0].pk).reserved_by == "worker-other"


@covers("claim_and_mark")
def test_a_claim_without_marks_is_one_statement():
    """One statement (MariaDB: the locking SELECT and the UPDATE of what it picked, in one
    transaction)."""
    engine = get_engine("default")
    Echo.dispatch_many([[i] for i in range(3)])
    with statements() as sent:
        claimed, _ = engine.claim_and_mark("worker-a", "echo", 10, [])
    assert len(claimed) == 3
    if connection.vendor == "mysql":
        assert [s.split()[0].upper() for s in sent] == ["START", "SELECT", "UPDATE", "COMMIT"]
    else:
        assert len(sent) == 1, sent


@covers("claim_and_mark")
def test_marks_and_claim_share_one_round_trip_or_one_transaction():
    """With marks and a limit: PostgreSQL sends one statement; SQLite and MariaDB one
    transaction. Each mark is still a compare-and-set: another worker's claim is refused."""
    engine = get_engine("default")
    Echo.dispatch_many([[i] for i in range(5)])
    mine, _ = engine.claim_and_mark("worker-a", "echo", 2, [])
    [theirs], _ = engine.claim_and_mark("worker-b", "echo", 1, [])
    marks = [Mark(j.id, j.attempts, '"ok"') for j in mine]
    stale = Mark(theirs.id, theirs.attempts, None)  # not worker-a's claim

    with statements() as sent:
        claimed, written = engine.claim_and_mark("worker-a", "echo", 5, [*marks, stale])

    if connection.vendor == "postgresql":
        assert len(sent) == 1, sent
    else:
        begin = "BEGIN IMMEDIATE" if connection.vendor == "sqlite" else "START TRANSACTION"
        assert (sent[0], sent[-1]) == (begin, "COMMIT"), sent
        assert len(writes(sent)) == (2 if connection.vendor == "sqlite" else 3), sent
    if connection.vendor == "mysql":
        # No UPDATE ... RETURNING: one mark was refused, so no id is vouched for (the
        # caller reads the claims it holds to sort them out).
        assert written == []
    else:
        assert sorted(written) == sorted(j.id for j in mine)
    assert len(claimed) == 2
    assert all(j.attempts == 1 and j.args in ([3], [4]) for j in claimed)
    states = dict(Job.objects.values_list("id", "state"))
    assert {states[j.id] for j in mine} == {JobState.SUCCEEDED}
    assert states[theirs.id] == JobState.RUNNING
    assert {states[j.id] for j in claimed} == {JobState.RUNNING}


@pytest.mark.skipif("connection.vendor != 'postgresql'")
@covers("claim_and_mark", "supports_keyset")
def test_postgres_marks_even_when_a_keyset_claim_finds_nothing():
    engine = get_engine("default")
    assert engine.supports_keyset
    Echo.dispatch_many([[i] for i in range(2)])
    claimed, _ = engine.claim_and_mark("worker-a", "echo", 5, [])
    after = Position({5: (claimed[-1].next_execution_at, claimed[-1].id)}, 1.0)
    with statements() as sent:
        nothing, written = engine.claim_and_mark(
            "worker-a", "echo", 5, [Mark(j.id, j.attempts, None) for j in claimed], after=after
        )
    assert len(sent) == 1
    assert nothing == []
    assert sorted(written) == sorted(j.id for j in claimed)
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() == 2


def _position(job: Any, lookback: float = 0.0) -> Position:
    """The keyset position just after ``job`` (a claimed job, or a Job row)."""
    return Position({job.priority: (job.next_execution_at, job.id)}, lookback)


@pytest.mark.skipif("connection.vendor != 'postgresql'")
@covers("claim_and_mark", "supports_keyset")
def test_a_keyset_claim_reads_each_priority_from_its_position():
    engine = get_engine("default")
    jobs = Noop.dispatch_many([[i] for i in range(5)])
    first = engine.claim_and_mark("w", "default", 2, [])[0]
    assert [j.id for j in first] == [jobs[0].pk, jobs[1].pk]
    urgent = Noop.dispatch("urgent", priority=50)  # a priority without a position
    back_dated = Noop.dispatch("late", at=timezone.now() - timedelta(hours=1))

    after = engine.claim_and_mark("w", "default", 3, [], after=_position(first[-1]))[0]
    # The new priority is read from the start of its range; the back-dated job lies
    # before the position of priority 0 and is not seen.
    assert [j.id for j in after] == [urgent.pk, jobs[2].pk, jobs[3].pk]
    full = engine.claim_and_mark("w", "default", 3, [])[0]
    assert {j.id for j in full} == {back_dated.pk, jobs[4].pk}  # the full claim sees it


@pytest.mark.skipif("connection.vendor != 'postgresql'")
@covers("claim_and_mark", "supports_keyset")
def test_the_lookback_finds_a_job_placed_just_before_the_position():
    engine = get_engine("default")
    [older, newer] = [Noop.dispatch(i) for i in range(2)]
    [newer_claim], _ = engine.claim_and_mark("w", "default", 1, [], after=_position(older))
    assert newer_claim.id == newer.pk
    # A position past ``older`` (as if it committed after ``newer`` was claimed): without
    # a lookback it is hidden, with one it is found.
    assert engine.claim_and_mark("w", "default", 1, [], after=_position(newer_claim)) == ([], [])
    after = _position(newer_claim, lookback=60)
    [found], _ = engine.claim_and_mark("w", "default", 1, [], after=after)
    assert found.id == older.pk


@covers("supports_keyset")
def test_an_engine_without_keyset_claims_ignores_the_position():
    engine = get_engine("default")
    if engine.supports_keyset:
        pytest.skip("this engine reads from the position (see the PostgreSQL tests)")
    [first, second] = Echo.dispatch_many([[1], [2]])
    row = Job.objects.get(pk=second.pk)
    after = Position({5: (row.next_execution_at, row.id)}, 0.0)  # past both
    claimed, _ = engine.claim_and_mark("worker-a", "echo", 5, [], after=after)
    assert sorted(j.id for j in claimed) == [first.pk, second.pk]
    assert engine.ready_queues(["echo"]) == []  # ``known`` is ignored too: nothing left


@pytest.mark.skipif("connection.vendor != 'postgresql'")
@covers("claim_and_mark", "pooled")
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
            claimed, _ = engine.claim_and_mark("worker-p", "echo", 2, [])
            assert len(claimed) == 2
            marks = [Mark(j.id, j.attempts, '"ok"') for j in claimed]
            assert sorted(engine.mark_succeeded("worker-p", marks)) == sorted(j.id for j in claimed)
        assert engine.claim_and_mark("worker-p", "echo", 2, []) == ([], [])

    try:
        connection.close()
        settings.GATOR_POOLED_DATABASES = []
        assert not engine.pooled
        drain()
        statements_ = prepared()
        assert len(statements_) == 2, statements_  # one claim, one mark, each prepared once
        assert any("FOR UPDATE SKIP LOCKED" in s for s in statements_), statements_
        assert any("unnest" in s and "succeeded" in s for s in statements_), statements_
        assert connection.connection.prepare_threshold is None  # left as Django set it
        assert Job.objects.filter(queue="echo", state=JobState.SUCCEEDED, result="ok").count() == 6

        connection.close()
        settings.GATOR_POOLED_DATABASES = ["default"]
        assert engine.pooled
        drain()
        assert prepared() == []
    finally:
        connection.close()


@covers("ready_queues")
def test_ready_queues_lists_the_queues_with_claimable_jobs_except_paused_ones():
    engine = get_engine("default")
    Echo.dispatch("e")
    Noop.dispatch(queue="zeta")
    Noop.dispatch(queue="later", wait=timedelta(hours=1))  # waiting: listed (not yet due)
    Noop.dispatch(queue="paused")
    pause_queue("paused")
    done = Noop.dispatch(queue="done")
    [claimed], _ = engine.claim_and_mark("w", "done", 1, [])
    assert claimed.id == done.pk

    with statements() as sent:
        queues = engine.ready_queues()
    assert queues == ["echo", "later", "zeta"]
    assert len(sent) == 1
    if engine.supports_keyset:
        assert engine.ready_queues(["echo", "zeta"]) == ["later"]


@covers("has_due_jobs")
def test_has_due_jobs_sees_a_locked_due_job_and_not_what_no_claim_may_take():
    engine = get_engine("default")
    Echo.dispatch("later", wait=timedelta(hours=1))
    Echo.dispatch("expired", expires_at=timezone.now() - timedelta(seconds=1))
    Noop.dispatch(queue="paused")
    pause_queue("paused")
    assert not engine.has_due_jobs(None)
    assert not engine.has_due_jobs([])
    due = Noop.dispatch(queue="zeta")
    with statements() as sent:
        assert engine.has_due_jobs(["zeta", "echo"])
    assert len(sent) == 1
    assert engine.has_due_jobs(None)
    assert not engine.has_due_jobs(["echo", "paused"])
    if connection.vendor != "sqlite":  # a claim skips a row another transaction locked
        with transaction.atomic():
            Job.objects.select_for_update().get(pk=due.pk)
            seen: list[bool] = []

            def look() -> None:
                try:
                    seen.append(engine.has_due_jobs(["zeta"]))
                finally:
                    connections.close_all()

            thread = threading.Thread(target=look)
            thread.start()
            thread.join(10)
        assert seen == [True]


@covers("claim_by_id")
def test_claim_by_id_takes_a_ready_job_due_or_not_and_nothing_else():
    engine = get_engine("default")
    later = Echo.dispatch("later", wait=timedelta(hours=1))
    job = engine.claim_by_id("inline", later.pk)
    assert job is not None
    assert (job.id, job.attempts, job.args) == (later.pk, 1, ["later"])
    row = Job.objects.get(pk=later.pk)
    assert (row.state, row.reserved_by) == (JobState.RUNNING, "inline")
    # Running (claimed already) or gone: None, and nothing is written.
    assert engine.claim_by_id("other", later.pk) is None
    assert Job.objects.get(pk=later.pk).reserved_by == "inline"
    assert engine.claim_by_id("other", later.pk + 1000) is None


@covers("running_claims", "claim_state")
def test_running_claims_and_claim_state_read_what_a_worker_holds():
    engine = get_engine("default")
    Echo.dispatch_many([[i] for i in range(3)])
    mine, _ = engine.claim_and_mark("worker-a", "echo", 2, [])
    [theirs], _ = engine.claim_and_mark("worker-b", "echo", 1, [])

    with statements() as sent:
        held = engine.running_claims("worker-a")
    assert len(sent) == 1
    assert sorted(held) == sorted(Claim(j.id, j.attempts) for j in mine)
    assert engine.running_claims("worker-c") == []

    with statements() as sent:
        state = engine.claim_state(theirs.id)
    assert len(sent) == 1
    assert state == ("running", 1, "worker-b")
    assert engine.claim_state(theirs.id + 1000) is None


@covers("isolate")
def test_isolate_is_a_compare_and_set_on_the_claim():
    engine = get_engine("default")
    Echo.dispatch("alone")
    [job], _ = engine.claim_and_mark("worker-a", "echo", 1, [])
    assert engine.isolate("worker-b", job.id, job.attempts) is False
    assert engine.isolate("worker-a", job.id, job.attempts + 1) is False
    assert Job.objects.get(pk=job.id).isolated is False
    with statements() as sent:
        assert engine.isolate("worker-a", job.id, job.attempts) is True
    assert len(sent) == 1
    assert Job.objects.get(pk=job.id).isolated is True
