"""A worker's start-up: the database missing or down, its tables not migrated, and stop
signals that arrive meanwhile. Real processes and real signals."""

from __future__ import annotations

import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from django_gator.worker.supervisor import WorkerProcess
from tests.conftest import database_url, run_worker, wait_for, worker_output

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def empty_database_url(tmp_path: Path) -> Iterator[str]:
    """A database of the suite's kind with no tables in it (migrate never ran)."""
    if connection.vendor == "sqlite":
        yield f"sqlite:///{tmp_path / 'unmigrated.sqlite3'}"
        return
    name = f"gator_empty_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name}")
    try:
        yield database_url().rsplit("/", 1)[0] + "/" + name
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE {name}")


def test_a_worker_on_an_unmigrated_database_exits_saying_to_run_migrate(
    spawn_worker, empty_database_url
):
    proc = spawn_worker(env={"DATABASE_URL": empty_database_url})

    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running after 30 s:\n{worker_output(proc)}") from None

    output = worker_output(proc)
    assert code == 1, output
    assert "the django_gator tables do not exist" in output
    assert "run `manage.py migrate`" in output
    assert "Traceback" not in output


def test_sigterm_stops_a_worker_that_is_retrying_an_unreachable_database(spawn_worker):
    # Nothing listens on port 1: every connection attempt fails at once.
    proc = spawn_worker(env={"DATABASE_URL": "postgres://postgres@127.0.0.1:1/nowhere"})
    wait_for(lambda: "will retry" in worker_output(proc), timeout=30)

    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"no exit 10 s after SIGTERM:\n{worker_output(proc)}") from None

    output = worker_output(proc)
    assert code == 0, output
    assert "Stopped while retrying" in output


def test_the_signal_handler_takes_no_lock():
    """A signal can land while the main thread holds the worker's lock; a handler that
    waited for that lock would never return."""
    worker = WorkerProcess(concurrency=1, install_signal_handlers=False)

    with worker.slots.lock:
        handler = threading.Thread(target=worker._handle_signal, args=(signal.SIGTERM, None))
        handler.start()
        handler.join(timeout=2)
        returned = not handler.is_alive()
        second = threading.Thread(target=worker._handle_signal, args=(signal.SIGTERM, None))
        second.start()
        second.join(timeout=2)
        returned_again = not second.is_alive()

    assert returned
    assert returned_again
    worker._take_signals()
    assert worker.slots.stopping
    assert worker.slots.forced


@pytest.mark.parametrize("debug", [True, False])
def test_a_worker_warns_at_start_that_debug_grows_its_memory(settings, caplog, debug):
    settings.DEBUG = debug
    caplog.set_level("WARNING", logger="django_gator.worker")

    run_worker()

    said = [r.getMessage() for r in caplog.records if "DEBUG is True" in r.getMessage()]
    if not debug:
        assert said == []
        return
    [line] = said
    assert "keeps the last 9000 queries of every database connection" in line
    assert "Never run workers with DEBUG = True in production" in line
