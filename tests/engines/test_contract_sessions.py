"""The contract's identity, time, sessions and wakeups, and the queues' gauges."""

from __future__ import annotations

import contextlib
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings
from django.utils import timezone

from django_gator import Workflow, pause_queue
from django_gator.attempts import Claim, Failure
from django_gator.engines import get_engine
from django_gator.models import Job, JobState
from django_gator.worker.connections import NetworkBounds
from tests.engines.conformance import covers, statements
from tests.testapp.jobs import Echo, Noop

pytestmark = pytest.mark.django_db(transaction=True)


@covers("alias", "vendor")
def test_an_engine_speaks_for_one_alias_and_its_vendor():
    engine = get_engine("default")
    assert (engine.alias, engine.vendor) == ("default", connection.vendor)
    assert get_engine("default") is engine  # one per alias, shared by every thread


@covers("db_now", "to_dt")
def test_time_is_the_databases_and_aware():
    engine = get_engine("default")
    with statements() as sent:
        now = engine.db_now()
    assert len(sent) == 1
    assert now.tzinfo is not None
    assert abs(now - timezone.now()) < timedelta(minutes=1)
    naive = datetime(2026, 1, 2, 3, 4, 5, 6)
    assert engine.to_dt(naive) == naive.replace(tzinfo=UTC)
    assert engine.to_dt("2026-01-02 03:04:05.000006") == naive.replace(tzinfo=UTC)


@covers("atomic_job")
def test_an_atomic_job_runs_in_one_transaction_that_an_error_rolls_back():
    engine = get_engine("default")

    def failing_job() -> None:
        with engine.atomic_job():
            assert connection.in_atomic_block
            Noop.dispatch()
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        failing_job()
    assert not Job.objects.exists()
    with engine.atomic_job():
        Noop.dispatch()
    assert Job.objects.count() == 1


@covers("prepare_bookkeeping")
def test_prepare_bookkeeping_sets_its_session_once(settings):
    engine = get_engine("default")
    settings.GATOR_POOLED_DATABASES = []
    connection.close()
    try:
        with statements() as first:
            engine.prepare_bookkeeping()
        with statements() as second:
            engine.prepare_bookkeeping()
        assert second == []  # cheap to call before every use
        if connection.vendor == "postgresql":
            assert len(first) == 1
            with connection.cursor() as cursor:
                cursor.execute("SHOW plan_cache_mode")
                assert cursor.fetchone()[0] == "force_generic_plan"
                cursor.execute("SHOW enable_seqscan")
                assert cursor.fetchone()[0] == "off"
        else:
            assert first == []
    finally:
        connection.close()  # the next test gets a session of its own


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL's session setting")
def test_a_bookkeeping_transaction_left_idle_is_ended_by_the_server(settings):
    # A worker process wedged between two statements of its lifeline's transaction (a job
    # holding the GIL in C code) held that transaction's row locks for as long as it
    # lived, and another process's rescue of the row waited on them for ever.
    engine = get_engine("default")
    settings.GATOR_POOLED_DATABASES = []
    settings.GATOR_HEARTBEAT_TIMEOUT = 1.0
    job = Noop.dispatch()
    connection.close()
    try:
        engine.prepare_bookkeeping()
        with connection.cursor() as cursor:
            cursor.execute("SHOW idle_in_transaction_session_timeout")
            assert cursor.fetchone()[0] == "1s"
        connection.set_autocommit(False)
        with connection.cursor() as cursor:
            cursor.execute("SELECT id FROM django_gator_job WHERE id = %s FOR UPDATE", [job.pk])
        time.sleep(2.0)  # deliberate: idle in its transaction past the 1 s limit (a wedged process)
        # The server ended the session: the lock is gone, another session takes it at once.
        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("SET lock_timeout = '2s'")
                cursor.execute("SELECT id FROM django_gator_job WHERE id = %s FOR UPDATE", [job.pk])
                assert cursor.fetchone()[0] == job.pk
        finally:
            other.close()
    finally:
        with contextlib.suppress(Exception):  # the session the server ended
            connection.set_autocommit(True)
        connection.close()


@covers("prepare_worker_session")
def test_prepare_worker_session_bounds_the_servers_side_of_the_session():
    engine = get_engine("default")
    bounds = NetworkBounds.for_timeout(30.0)
    connection.ensure_connection()
    try:
        engine.prepare_worker_session(connection.connection, bounds)
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SHOW tcp_user_timeout")
                assert cursor.fetchone()[0] == str(bounds.user_timeout_ms)  # in ms
            elif connection.vendor == "mysql":
                cursor.execute("SELECT VERSION()")
                if "mariadb" in cursor.fetchone()[0].lower():
                    cursor.execute("SELECT @@session.idle_transaction_timeout")
                    assert cursor.fetchone()[0] == bounds.idle_transaction_timeout
    finally:
        connection.close()


@covers("can_listen", "listen", "wake")
@override_settings(GATOR_NOTIFY=True)  # the default (the suite may run with it off)
def test_wakeups_reach_a_listener_where_the_engine_can_listen():
    engine = get_engine("default")
    if not engine.can_listen:
        with pytest.raises(NotImplementedError), engine.listen():
            pass
        with statements() as sent:
            engine.wake(["echo"])
        assert sent == []  # its workers poll
        return
    with engine.listen() as listener:
        with transaction.atomic():
            engine.wake(["echo", "other"])
            assert listener.wait(0.2) == set()  # delivered on commit
        received: set[str] = set()
        for _ in range(50):
            received |= listener.wait(0.2)
            if received >= {"echo", "other"}:
                break
        assert received == {"echo", "other"}
        Echo.dispatch("notified")  # dispatch's INSERT notifies too
        assert "echo" in listener.wait(10)


@covers("notifies")
def test_notify_is_the_wakeup_of_engines_that_listen_unless_turned_off():
    engine = get_engine("default")
    with override_settings(GATOR_NOTIFY=True):  # the default (the suite may run with it off)
        assert engine.notifies == engine.can_listen
    with override_settings(GATOR_NOTIFY=False):
        assert not engine.notifies
    if not engine.can_listen:
        return
    with engine.listen() as listener:
        with override_settings(GATOR_NOTIFY=False):
            # Neither a dispatch (its single INSERT, its unnest() INSERT) nor a wake
            # NOTIFYs: the wakeup datagrams of django_gator.wakeup instead
            # (tests/test_wakeup.py, the COPY too).
            Echo.dispatch("single")
            Echo.dispatch_many([["a"], ["b"]])
            engine.wake(["echo"])
            assert listener.wait(0.5) == set()
        with override_settings(GATOR_NOTIFY=True):
            Echo.dispatch("notified")
            assert listener.wait(10) == {"echo"}


@covers("listen_ends", "flag_awaited", "flag_awaited_run")
def test_the_end_of_an_awaited_job_or_step_reaches_a_listener_where_the_engine_can_listen():
    engine = get_engine("default")
    job = Echo.dispatch("awaited", wait=timedelta(hours=1))
    if not engine.can_listen:
        with pytest.raises(NotImplementedError), engine.listen_ends():
            pass
        with pytest.raises(NotImplementedError):
            engine.flag_awaited(job.pk)
        with pytest.raises(NotImplementedError):
            engine.flag_awaited_run(uuid.uuid4())
        return
    other = Echo.dispatch("not awaited", wait=timedelta(hours=1))
    with engine.listen_ends() as listener:
        assert engine.flag_awaited(job.pk) == JobState.WAITING
        assert engine.flag_awaited(job.pk + 1000) is None  # no such job
        Job.objects.filter(pk=other.pk).update(state=JobState.CANCELLED)
        Job.objects.filter(pk=job.pk).update(state=JobState.FAILED)  # not an end
        assert listener.wait(0.2) == set()  # deliberate: nothing comes
        with transaction.atomic():
            Job.objects.filter(pk=job.pk).update(state=JobState.DEAD)
            assert listener.wait(0.2) == set()  # deliberate: delivered on commit
        assert listener.wait(10) == {f"j{job.pk}"}
        assert engine.flag_awaited(job.pk) == JobState.DEAD  # ended: the flag says so

        wf = Workflow(name="flagged")
        wf.add_wait("go", timeout=timedelta(hours=1), name="gate")
        run = wf.dispatch()
        engine.flag_awaited_run(run.pk)
        assert set(run.steps.values_list("awaited", flat=True)) == {True}
        run.cancel(by="test")
        assert listener.wait(10) == {f"r{run.pk}"}


@covers("queue_gauges")
def test_the_gauges_of_every_queue_in_one_statement():
    engine = get_engine("default")
    Echo.dispatch_many([[1], [2], [3]])
    Echo.dispatch("later", wait=timedelta(hours=1))
    engine.claim_and_mark("worker-a", "echo", 1, [])
    [dead], _ = engine.claim_and_mark("worker-a", "echo", 1, [])
    failure = Failure(dead=True, retry_in=None, queue="echo", error="{}", last_error="E: x")
    assert engine.mark_failed_and_insert("worker-a", Claim(dead.id, dead.attempts), failure, [])
    pause_queue("quiet")

    with statements() as sent:
        now, gauges = engine.queue_gauges()
    assert len(sent) == 1
    assert abs(now - timezone.now()) < timedelta(minutes=1)
    by_name = {g.queue: g for g in gauges}
    assert [g.queue for g in gauges] == ["echo", "quiet"]
    echo = by_name["echo"]
    assert (echo.ready, echo.scheduled, echo.running, echo.dead, echo.paused) == (1, 1, 1, 1, False)
    assert echo.oldest_due_at is not None
    assert echo.oldest_running_at is not None
    assert by_name["quiet"].paused is True
