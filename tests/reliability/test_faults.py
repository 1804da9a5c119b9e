"""Faults from RELIABILITY.md with real processes: a frozen worker and killed database
connections; and a static scan of the package for unsafe decoders and dynamic imports."""

from __future__ import annotations

import ast
import signal
import time
from pathlib import Path

import pytest
from django.db import connection

from django_gator.engines import get_engine
from django_gator.models import Job, JobState, Worker
from tests.chaos import kill_worker_connections
from tests.conftest import ROOT, stop_worker, wait_for, worker_output
from tests.testapp.jobs import RecordWithRetry, Sleep
from tests.testapp.models import Execution

PACKAGE = ROOT / "django_gator"


def freeze(proc) -> None:
    """SIGSTOP ``proc``. On SQLite, at a moment it holds no write lock: a process stopped
    inside a write transaction (a heartbeat, a claim) would stop every writer of the file,
    which is SQLite's nature, not the fault under test; so it is thawed and stopped again
    until a write can start."""
    for _ in range(50):
        proc.send_signal(signal.SIGSTOP)
        if connection.vendor != "sqlite":
            return
        import sqlite3

        probe = sqlite3.connect(connection.settings_dict["NAME"], timeout=0.2)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.rollback()
            return
        except sqlite3.OperationalError:
            proc.send_signal(signal.SIGCONT)
            time.sleep(0.05)
        finally:
            probe.close()
    raise AssertionError("the worker held SQLite's write lock at every one of 50 stops")


@pytest.mark.django_db(transaction=True)
def test_a_frozen_worker_is_rescued_and_its_late_writes_change_nothing(spawn_worker):
    job = Sleep.dispatch(4, label="frozen")
    frozen = spawn_worker("--concurrency", "1")
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING)
    freeze(frozen)
    try:
        Job.objects.filter(pk=job.pk).update(args=[0.1])  # the rescued run is quick
        rescuer = spawn_worker("--concurrency", "1")
        wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED, timeout=60)
        done = Job.objects.get(pk=job.pk)
    finally:
        frozen.send_signal(signal.SIGCONT)

    # The thawed worker finishes its sleep, writes its ledger row (an effect outside the
    # job row: at-least-once) and then its success mark, which must find the job gone.
    wait_for(lambda: Execution.objects.filter(job_id=job.pk, attempt=1).exists(), timeout=30)
    wait_for(lambda: "the claim was lost" in worker_output(frozen), timeout=30)
    after = Job.objects.get(pk=job.pk)
    assert (after.state, after.attempts, after.reserved_by, after.finished_at) == (
        JobState.SUCCEEDED,
        2,
        done.reserved_by,
        done.finished_at,
    )
    assert after.errors[0]["class"] == "django_gator.exceptions.WorkerLost"
    for proc in (frozen, rescuer):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, worker_output(proc)


def back_at_work(since, total: int) -> bool:
    """Whether a job succeeded after ``since``, or all ``total`` of them have."""
    succeeded = Job.objects.filter(state=JobState.SUCCEEDED)
    return succeeded.filter(finished_at__gt=since).exists() or succeeded.count() == total


@pytest.mark.django_db(transaction=True)
def test_killed_database_connections_lose_nothing(spawn_worker):
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no server connections to kill")
    # A job whose own query meets the killed connection fails like any job and is retried
    # by its policy; what must not happen is a job lost, stuck running, or a dead worker.
    jobs = RecordWithRetry.dispatch_many([{"label": f"k{i}", "sleep": 0.005} for i in range(400)])
    # A job whose query waits on a lock left by a killed connection can take a while
    # (MariaDB's lock wait timeout): the shutdown timeout bounds how long SIGTERM waits.
    workers = [spawn_worker("--concurrency", "4", "--shutdown-timeout", "5") for _ in range(2)]
    # Both workers running jobs first (on a loaded machine their start-up takes a while).
    wait_for(lambda: Worker.objects.count() == 2, timeout=60)
    wait_for(lambda: Job.objects.exclude(state=JobState.WAITING).exists(), timeout=60)
    killed = 0
    for _ in range(3):
        killed += kill_worker_connections()
        # Before the next kill, the workers are back at work: a success written since.
        since = get_engine("default").db_now()
        wait_for(lambda since=since: back_at_work(since, len(jobs)), timeout=60)
    assert killed > 0

    wait_for(lambda: not Job.objects.exclude(state=JobState.SUCCEEDED).exists(), timeout=120)
    for proc in workers:
        assert proc.poll() is None, worker_output(proc)  # still alive
    for proc in workers:
        stop_worker(proc)
    ids = [j.pk for j in jobs]
    assert Job.objects.filter(pk__in=ids, state=JobState.SUCCEEDED).count() == len(ids)
    assert set(Execution.objects.values_list("job_id", flat=True)) == set(ids)


def _python_files(under: Path) -> list[Path]:
    return sorted(p for p in under.rglob("*.py") if "migrations" not in p.parts)


UNSAFE_MODULES = {"pickle", "cPickle", "marshal", "shelve", "dill", "yaml"}
#: Modules allowed one of them, and why. worker/isolated_child.py checks that an exception
#: can cross the multiprocessing pipe (which pickles) between a worker and the child it
#: forked for an isolated attempt: both ends run the project's own code; nothing read from
#: a row, a request or the network is ever unpickled (rows stay JSON).
ALLOWED_UNSAFE = {("isolated_child.py", "pickle")}


def test_the_package_has_no_unsafe_decoder_or_eval():
    problems = []
    for path in _python_files(PACKAGE):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [(node.module or "").split(".")[0]]
            else:
                names = []
            problems += [
                f"{path.name}:{node.lineno} imports {n}"
                for n in names
                if n in UNSAFE_MODULES and (path.name, n) not in ALLOWED_UNSAFE
            ]
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in {"eval", "exec", "compile", "__import__"}
            ):
                problems.append(f"{path.name}:{node.lineno} calls {node.func.id}()")
    assert problems == []


def test_rows_reach_code_only_through_the_registry():
    # The worker, the engines, dispatch, chains and the scheduler never import by name:
    # a row's job name becomes code only through registry.get_job_class().
    dynamic = {"import_module", "import_string", "__import__", "getattr_static"}
    problems = []
    paths = [
        *_python_files(PACKAGE / "worker"),
        *_python_files(PACKAGE / "engines"),
        PACKAGE / "dispatch.py",
        PACKAGE / "chain.py",
        PACKAGE / "queueable.py",
        PACKAGE / "jobfunction.py",
        PACKAGE / "registry.py",
        PACKAGE / "rows.py",
    ]
    for path in paths:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name in dynamic:
                        problems.append(f"{path.name}:{node.lineno} imports {alias.name}")
            if name in dynamic:
                problems.append(f"{path.name}:{node.lineno} calls {name}()")
    assert problems == []
