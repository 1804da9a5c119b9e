"""A database outage is not the job's fault (issue 29; RELIABILITY.md "Database connection
killed", "Failover"): an attempt whose own queries lose the connection is given back and
tried again once the database answers, without charging the job's retry budget, up to
GATOR_OUTAGE_RETRIES; the worker survives, and a stopped worker removes its row.

The restart and failover tests run the chaos harness (tests/chaos.py) against a throwaway
PostgreSQL cluster of their own (tests/clusters.py), never the shared server: in the
PostgreSQL pass of ``make test`` only, as they need no test database of their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from django.db import DatabaseError, OperationalError, connection, connections

from django_gator.engines.outages import is_outage
from django_gator.models import Job, JobState
from django_gator.worker.policy import outage_failure
from tests.chaos import kill_backend
from tests.conftest import ROOT, worker_output
from tests.factories import claimed_job
from tests.testapp.jobs import LosesItsConnection
from tests.testapp.models import Execution

BACKEND_ID_SQL = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}

server_only = pytest.mark.skipif(
    connection.vendor == "sqlite", reason="SQLite has no server whose connection can be lost"
)


def _killed_connection_error() -> BaseException:
    """The error a query raises on a connection that the server killed (a real one)."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(BACKEND_ID_SQL[connection.vendor])
            backend = int(cursor.fetchone()[0])
        kill_backend(backend)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with other.cursor() as cursor:
                    cursor.execute("SELECT 1")
            except Exception as exc:  # what the job would have seen
                return exc
            time.sleep(0.05)
        raise AssertionError("the killed connection kept answering")
    finally:
        other.close()


# -- which errors are outages -------------------------------------------------------------


@server_only
@pytest.mark.django_db(transaction=True)
def test_a_killed_connection_is_an_outage_and_a_bad_statement_is_not():
    lost = _killed_connection_error()
    assert is_outage(lost), repr(lost)

    class JobsOwnError(Exception):
        pass

    wrapped = JobsOwnError("wrapped by the job")
    wrapped.__cause__ = lost
    assert is_outage(wrapped), "an error raised from an outage is one"

    with pytest.raises(DatabaseError) as bad_sql, connection.cursor() as cursor:
        cursor.execute("SELECT no_such_column FROM django_gator_job")
    assert not is_outage(bad_sql.value)
    assert not is_outage(ValueError("server closed the connection unexpectedly"))


@pytest.mark.django_db
def test_sqlite_busy_and_plain_errors_are_not_outages():
    import sqlite3

    busy = OperationalError("database is locked")
    busy.__cause__ = sqlite3.OperationalError("locked")
    assert not is_outage(busy)
    assert not is_outage(None)


@server_only
@pytest.mark.django_db(transaction=True)
def test_outage_failure_gives_the_attempt_back_up_to_the_bound(settings):
    lost = _killed_connection_error()
    job = claimed_job(name=LosesItsConnection.name, attempts=1)
    failure = outage_failure(job, "w1", lost)
    assert failure is not None
    assert failure.uncharged
    assert failure.outage
    assert not failure.dead
    assert failure.retry_in == 1.0
    entry = json.loads(failure.error)
    assert entry["outage"] is True
    assert "outage 1 of 10" in entry["note"]

    job.outages = 3
    assert outage_failure(job, "w1", lost).retry_in == 8.0  # type: ignore[union-attr]
    settings.GATOR_OUTAGE_RETRIES = 3
    assert outage_failure(job, "w1", lost) is None, "past the bound, the policy decides"
    assert outage_failure(claimed_job(attempts=1), "w1", ValueError("no")) is None


# -- a worker whose job loses its connection ----------------------------------------------


def _run_losing_job(tmp_path: Path, spawn_worker, env: dict[str, str]) -> Job:
    backend_file, go_file = tmp_path / "backend", tmp_path / "go"
    job = LosesItsConnection.dispatch(backend_file=str(backend_file), go_file=str(go_file))
    worker = spawn_worker("--concurrency", "2", env=env)
    deadline = time.monotonic() + 60
    while not backend_file.exists():
        assert time.monotonic() < deadline, worker_output(worker)
        time.sleep(0.02)
    kill_backend(int(backend_file.read_text()))
    go_file.touch()
    while True:
        job.refresh_from_db()
        if job.state in (JobState.SUCCEEDED, JobState.DEAD):
            return job
        assert time.monotonic() < deadline, f"job {job.state}\n{worker_output(worker)}"
        assert worker.poll() is None, worker_output(worker)
        time.sleep(0.05)


@server_only
@pytest.mark.django_db(transaction=True)
def test_a_job_without_retry_policy_whose_connection_is_killed_runs_again_uncharged(
    tmp_path: Path, spawn_worker
):
    job = _run_losing_job(tmp_path, spawn_worker, {})
    assert job.state == JobState.SUCCEEDED
    assert job.attempts == 1, "the retry budget is untouched"
    assert job.outages == 1
    [entry] = job.errors
    assert entry["outage"] is True
    assert entry["attempt"] == 1
    assert "retried without charging an attempt" in entry["note"]
    assert Execution.objects.filter(job_id=job.pk).count() == 1


@server_only
@pytest.mark.django_db(transaction=True)
def test_past_gator_outage_retries_the_jobs_own_policy_applies(tmp_path: Path, spawn_worker):
    job = _run_losing_job(tmp_path, spawn_worker, {"GATOR_OUTAGE_RETRIES": "0"})
    assert job.state == JobState.DEAD, "no retry policy: dead after its one attempt"
    assert job.attempts == 1
    assert job.outages == 0
    assert "outage" not in job.errors[0]


# -- the chaos harness on a throwaway server ------------------------------------------------


def _chaos(cluster_args: list[str], env: dict[str, str], faults: str, log: Path) -> dict:
    """Run tests.chaos on the throwaway database in a process of its own; its report."""
    command = [
        sys.executable,
        "-m",
        "tests.chaos",
        "--yes",
        "--json",
        "--jobs",
        "1200",
        "--kills",
        "0",
        "--faults",
        faults,
        "--no-retry-share",
        "0.6",
        "--drain-s",
        "12",
        *cluster_args,
    ]
    # Its own process group, with the workers it starts: whatever happens, none of them
    # outlives the test (a worker left running would retry a removed server for ever).
    with log.open("w") as out:
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=out,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, _ = proc.communicate(timeout=900)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    done = subprocess.CompletedProcess(command, proc.returncode, stdout)
    failure = f"exit {done.returncode}\n{done.stdout}\n{log.read_text()[-5000:]}"
    assert done.returncode in (0, 1), failure
    assert done.stdout.strip(), failure
    report = json.loads(done.stdout)
    shown = ("faults", "recover_s", "outage_retries", "in_flight_at_faults", "outage_reruns")
    print(json.dumps({k: report[k] for k in shown}))
    return report


def _assert_nothing_lost(report: dict) -> None:
    assert report["lost"] == [], report["details"]
    assert report["stuck"] == [], report["details"]
    assert report["duplicated"] == [], report["details"]
    assert report["over_limit"] == [], report["details"]
    assert report["atomic_duplicates"] == [], report["details"]
    assert report["bad_exits"] == []
    assert report["leftover_workers"] == [], "a stopped worker left its row behind"
    # The faults met running jobs (else this test proves nothing); none was charged an
    # attempt for it.
    assert report["in_flight_at_faults"] > 0
    assert report["failed_attempts"] <= report["misbehaving_jobs"]


def _throwaway_env(url: str, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("TOX_PARALLEL_ENV", None)
    env.pop("GATOR_TEST_DB_NAME", None)
    env.update(extra)
    return env


def _clusters():
    from tests import clusters

    if clusters.server_binaries() is None:
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail("CI needs PostgreSQL's server binaries (initdb) for the outage tests")
        pytest.skip("no PostgreSQL server binaries (initdb): cannot make a throwaway cluster")
    return clusters


@pytest.mark.slow
@pytest.mark.clusters
@pytest.mark.timeout(1200)
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="runs in the PostgreSQL pass (on a throwaway cluster of its own)",
)
@pytest.mark.parametrize(
    ("faults", "async_commit"),
    [("restart_fast=3", "1"), ("restart_immediate=3", "0")],
    ids=["fast", "immediate"],
)
def test_server_restarts_mid_drain_lose_and_kill_nothing(
    tmp_path: Path, faults: str, async_commit: str
):
    """``-m fast`` flushes every commit before it stops, so the default asynchronous
    success marks survive it. ``-m immediate`` is a crash: it undoes the last moments of
    asynchronous commits, and the jobs whose success marks it undid run again (at least
    once, as docs/reliability.md says); with GATOR_ASYNC_COMMIT = False nothing runs
    twice, which this test holds it to."""
    clusters = _clusters()
    with clusters.throwaway_cluster() as server:
        report = _chaos(
            ["--server", f"{server.data}:{server.port}"],
            _throwaway_env(server.url("gator"), GATOR_ASYNC_COMMIT=async_commit),
            faults,
            tmp_path / "chaos.log",
        )
    _assert_nothing_lost(report)
    name, _, count = faults.partition("=")
    assert report["faults"][name] == int(count)
    assert report["outage_retries"] > 0, "no job's own query met the restarts"


@pytest.mark.slow
@pytest.mark.clusters
@pytest.mark.timeout(1200)
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="runs in the PostgreSQL pass (on a throwaway cluster of its own)",
)
def test_failover_to_a_promoted_synchronous_standby_mid_drain_loses_and_kills_nothing(
    tmp_path: Path,
):
    clusters = _clusters()
    with clusters.throwaway_cluster() as primary, clusters.standby_of(primary) as standby:
        hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
        report = _chaos(
            [
                "--server",
                f"{primary.data}:{primary.port}",
                "--standby",
                f"{standby.data}:{standby.port}",
            ],
            _throwaway_env(primary.url("gator"), GATOR_TEST_PG_HOSTS=hosts, GATOR_ASYNC_COMMIT="0"),
            "failover=1",
            tmp_path / "chaos.log",
        )
    _assert_nothing_lost(report)
    assert report["faults"]["failover"] == 1


@server_only
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.django_db(transaction=True)
def test_connection_kills_mid_drain_kill_no_job_without_a_retry_policy(tmp_path: Path):
    """Every worker connection killed by the server (``KILL CONNECTION`` on MariaDB,
    ``pg_terminate_backend`` on PostgreSQL) three times while 600 jobs drain, most of them
    without a retry policy: none ends dead, none is charged an attempt for it."""
    from tests.chaos import Chaos
    from tests.conftest import worker_env

    chaos = Chaos(
        env=worker_env(),
        jobs=600,
        kills=0,
        faults={"connkill": 3},
        no_retry_share=0.6,
        drain_s=8,
        log_dir=tmp_path,
    )
    try:
        report = chaos.run()
    finally:
        chaos.kill_everything()
    print("\n" + report.summary())
    _assert_nothing_lost(asdict(report))
    assert report.faults["connkill"] == 3
