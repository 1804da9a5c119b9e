"""Warm connections (worker/warm.py): an executor thread opens its connections before it is
handed a job, renews them while idle, and a kept connection is trusted without a query
unless the server spoke on it. Counted with Django's ``connection_created`` signal: no
connect may happen on a thread while it runs a job."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from django.core import checks
from django.db import connection, connections
from django.db.backends.signals import connection_created
from django.test import override_settings

from django_gator.conf import InvalidSetting
from django_gator.worker import connections as worker_connections
from django_gator.worker import warm
from django_gator.worker.hygiene import before_job
from django_gator.worker.queues import parse_queue_specs
from django_gator.worker.supervisor import WorkerProcess
from django_gator.worker.warm import server_spoke, warm_aliases
from tests.chaos import kill_backend
from tests.conftest import run_worker, start_worker_thread, wait_for
from tests.testapp import jobs
from tests.testapp.jobs import NotesItsConnection

pytestmark = pytest.mark.django_db(transaction=True)

#: (thread name, alias, time.monotonic()) of each connection opened in this process.
Connects = list[tuple[str, str, float]]


@pytest.fixture
def connects() -> Iterator[Connects]:
    seen: Connects = []

    def note(sender: object, connection: object, **kwargs: object) -> None:
        alias = getattr(connection, "alias", "?")
        seen.append((threading.current_thread().name, alias, time.monotonic()))

    connection_created.connect(note, weak=False, dispatch_uid="test_warm")
    jobs.CONNECTION_NOTES.clear()
    try:
        yield seen
    finally:
        connection_created.disconnect(dispatch_uid="test_warm")
        jobs.CONNECTION_NOTES.clear()


def connects_inside_jobs(seen: Connects) -> list[tuple[str, str, float]]:
    """The connects made on a thread while it ran a job (each job's start to its end)."""
    return [
        (thread, alias, at)
        for thread, alias, at in seen
        for name, _, started, ended in jobs.CONNECTION_NOTES
        if thread == name and started <= at <= ended
    ]


def test_every_job_of_a_fresh_worker_finds_its_connection_open(connects: Connects):
    NotesItsConnection.dispatch_many([[0.05]] * 12)

    run_worker("warm", concurrency=4)

    notes = jobs.CONNECTION_NOTES
    assert len(notes) == 12
    assert len({thread for thread, *_ in notes}) > 1, "the jobs ran on several threads"
    assert [was_open for _, was_open, *_ in notes] == [True] * 12, notes
    assert connects_inside_jobs(connects) == []
    executors = {thread for thread, alias, _ in connects if thread.startswith("gator-executor")}
    assert len(executors) == 4, "each executor thread connected before its first job"


@override_settings(GATOR_WARM_CONNECTIONS=[])
def test_without_warm_connections_a_threads_first_job_connects(connects: Connects):
    NotesItsConnection.dispatch_many([[0.05]] * 8)

    run_worker("warm", concurrency=4)

    first_runs: dict[str, tuple[bool, float, float]] = {}
    for thread, was_open, started, ended in jobs.CONNECTION_NOTES:
        first_runs.setdefault(thread, (was_open, started, ended))
    assert {was_open for was_open, _, _ in first_runs.values()} == {False}, (
        "each thread's first job found no connection"
    )
    inside = connects_inside_jobs(connects)
    # Each thread's first job connected (on MariaDB under Django 6.1 twice: a temporary
    # connection reads the server's version first), and no later job did.
    assert {thread for thread, _, _ in inside} == set(first_runs)
    for thread, _, at in inside:
        _, started, ended = first_runs[thread]
        assert started <= at <= ended, f"a later job of {thread} connected again"


@override_settings(GATOR_WORKER_CONN_MAX_AGE=1.5)
def test_an_idle_thread_renews_its_connection_before_it_ages_out(connects: Connects):
    worker = WorkerProcess(
        parse_queue_specs(["warm"]), concurrency=2, install_signal_handlers=False
    )
    thread = start_worker_thread(worker)
    try:
        # Renewed 1 s before the end of a 1.5 s age: every ~0.5 s while idle.
        wait_for(lambda: sum(t.startswith("gator-executor") for t, *_ in connects) >= 6, 20)
        for run in range(1, 5):
            NotesItsConnection.dispatch(0)
            wait_for(lambda run=run: len(jobs.CONNECTION_NOTES) == run, 20)
            # deliberate: let the connections age past the next renewal while idle
            time.sleep(0.7)
    finally:
        worker.request_stop()
        thread.join(30)
    assert not thread.is_alive()
    assert len(jobs.CONNECTION_NOTES) == 4
    assert all(was_open for _, was_open, *_ in jobs.CONNECTION_NOTES), jobs.CONNECTION_NOTES
    assert connects_inside_jobs(connects) == []


def test_warm_aliases_default_to_default_and_the_job_database_and_refuse_an_unknown_one():
    assert warm_aliases() == ("default",)
    with override_settings(GATOR_WARM_CONNECTIONS=["default", "default"]):
        assert warm_aliases() == ("default",)
    with override_settings(GATOR_WARM_CONNECTIONS=["default", "nowhere"]):
        with pytest.raises(InvalidSetting, match=r"'nowhere'.*not a key of DATABASES"):
            warm_aliases()
        errors = [m.msg for m in checks.run_checks() if m.id == "django_gator.E003"]
        assert any("GATOR_WARM_CONNECTIONS names 'nowhere'" in e for e in errors), errors


def test_a_healthy_kept_connection_is_trusted_without_a_query():
    undo = worker_connections.prepare()
    try:
        connection.close()
        NotesItsConnection.dispatch(0)  # opens a connection kept for its max age
        before_job(connections.all())
    finally:
        undo()
    if connection.vendor == "sqlite":
        assert server_spoke(connection) is None
        assert not connection.health_check_done  # type: ignore[attr-defined]
    else:
        assert server_spoke(connection) is False
        assert connection.health_check_done, "no SELECT 1 before the job's first query"  # type: ignore[attr-defined]


def test_a_connection_opened_or_found_quiet_moments_ago_is_not_polled_again(monkeypatch):
    if connection.vendor == "sqlite":
        pytest.skip("no socket to poll: SQLite keeps Django's health check")
    polls: list[object] = []
    real = warm.server_spoke

    def counted(conn: object) -> bool | None:
        polls.append(conn)
        return real(conn)

    monkeypatch.setattr(warm, "server_spoke", counted)
    undo = worker_connections.prepare()
    try:
        connection.close()
        connection.ensure_connection()  # just opened: trusted for the window
        before_job([connection])
        assert polls == []
        assert connection.health_check_done  # type: ignore[attr-defined]
        connection._gator_trusted_at -= warm.TRUST_WINDOW  # type: ignore[attr-defined]
        before_job([connection])
        before_job([connection])
    finally:
        undo()
    assert len(polls) == 1, "found quiet once, then trusted for the window"
    assert connection.health_check_done  # type: ignore[attr-defined]


def test_a_connection_the_server_ended_is_checked_and_replaced_before_the_job_uses_it(
    monkeypatch,
):
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no server to end a session")
    monkeypatch.setattr(warm, "TRUST_WINDOW", 0.0)  # else a new connection skips the poll
    undo = worker_connections.prepare()
    try:
        connection.close()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_backend_pid()"
                if connection.vendor == "postgresql"
                else "SELECT CONNECTION_ID()"
            )
            backend = cursor.fetchone()[0]
        kill_backend(backend)
        wait_for(lambda: server_spoke(connection), 10)
        before_job(connections.all())
        assert not connection.health_check_done  # type: ignore[attr-defined]
        assert NotesItsConnection.dispatch(0).pk, "the job's first query reconnected"
    finally:
        undo()
