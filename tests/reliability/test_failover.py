"""Failover of the primary under load (issue 33, item 3), on throwaway clusters (initdb, a
``pg_basebackup -R`` standby, their own ports; see tests/clusters.py).

Workers and a dispatcher reach the database through a libpq multi-host connection string
(``HOST=h1,h2``, ``target_session_attrs=read-write``), as on a managed database whose
primary can move. The primary is stopped abruptly (``-m immediate``: no shutdown, as a
crashed host) while jobs run and dispatches arrive, and the standby is promoted.

- Synchronous standby: every job whose ``dispatch()`` returned is on the new primary and
  ends succeeded, none is left ``running``, an atomic job's ledger row exists once, and
  the time from the promote until the workers run jobs again is printed (published in
  docs/deployment.md).
- Asynchronous standby: what can be lost is exactly the commits the standby had not
  received. The test cuts replication, dispatches, then fails over: the jobs dispatched
  after the cut are gone, every one before it is there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.conftest import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.clusters,
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="runs in the PostgreSQL pass (on throwaway clusters of its own)",
    ),
]


def _clusters():
    from tests import clusters

    if clusters.server_binaries() is None:
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail("CI needs PostgreSQL's server binaries (initdb) for the failover tests")
        pytest.skip("no PostgreSQL server binaries (initdb): cannot make a throwaway cluster")
    return clusters


def _env(url: str, hosts: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "GATOR_TEST_PG_HOSTS": hosts,
        "GATOR_ASYNC_COMMIT": "0",  # success marks wait for the standby too
        "GATOR_TEST_SUBPROCESS": "1",
    }
    env.pop("TOX_PARALLEL_ENV", None)
    env.pop("GATOR_TEST_DB_NAME", None)
    return env


def _conninfo(*ports: int) -> str:
    hosts = ",".join("127.0.0.1" for _ in ports)
    return (
        f"host={hosts} port={','.join(map(str, ports))} dbname=gator user=postgres "
        "target_session_attrs=read-write connect_timeout=5"
    )


def _query(conninfo: str, sql: str) -> list[tuple]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


@contextlib.contextmanager
def _processes(log_dir: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts, each in a session of its own, all killed at the end."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _start(procs: list, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    procs.append(proc)
    return proc


def _migrate(env: dict[str, str], log: Path) -> None:
    with log.open("wb") as out:
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--run-syncdb", "-v0"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=300,
        )


def _returned(path: Path) -> dict[int, str]:
    """The jobs whose dispatch returned, by id (see tests/failover_dispatcher.py)."""
    rows = (line.split() for line in path.read_text().splitlines() if line.strip())
    return {int(job_id): label for job_id, label in rows}


def _wait(predicate, timeout: float, what: str, interval: float = 0.1) -> float:
    """Wait until ``predicate()`` is true; the seconds it took."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, f"{what}: not within {timeout} s"
        threading.Event().wait(interval)
    return time.monotonic() - started


@pytest.mark.timeout(900)
def test_a_failover_to_a_synchronous_standby_under_load_loses_and_strands_nothing(
    tmp_path: Path,
):
    clusters = _clusters()
    with (
        clusters.throwaway_cluster() as primary,
        clusters.standby_of(primary, synchronous=True) as standby,
        _processes(tmp_path) as procs,
    ):
        both = _conninfo(primary.port, standby.port)
        env = _env(primary.url("gator"), f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}")
        _migrate(env, tmp_path / "migrate.log")
        workers = [
            _start(
                procs,
                ["-m", "django", "gator_worker", "--concurrency", "4"],
                env,
                tmp_path / f"worker-{n}.log",
            )
            for n in range(2)
        ]
        _wait(
            lambda: _query(both, "SELECT count(*) FROM django_gator_worker")[0][0] >= 2,
            60,
            "two workers registered",
        )
        dispatched = tmp_path / "dispatched"
        dispatcher = _start(
            procs,
            ["-m", "tests.failover_dispatcher", str(dispatched), "14"],
            env,
            tmp_path / "dispatcher.log",
        )
        _wait(lambda: dispatched.exists() and len(_returned(dispatched)) >= 150, 60, "dispatches")

        primary.stop("immediate")  # a crash: no shutdown, nothing flushed beyond the WAL
        crashed_at = time.monotonic()
        # What the standby holds at the crash (a hot standby answers reads).
        reading = f"host=127.0.0.1 port={standby.port} dbname=gator user=postgres"
        done_before = _query(reading, "SELECT count(*) FROM testapp_execution")[0][0]
        standby.promote()
        promoted_at = time.monotonic()
        new = _conninfo(standby.port)
        back_after = _wait(
            lambda: _query(new, "SELECT count(*) FROM testapp_execution")[0][0] > done_before,
            120,
            "a job ran on the promoted standby",
            interval=0.02,
        )
        dispatcher.wait(timeout=120)

        returned = _returned(dispatched)
        _wait(
            lambda: (
                _query(
                    new,
                    "SELECT count(*) FROM django_gator_job WHERE state NOT IN "
                    "('succeeded', 'dead', 'cancelled')",
                )[0][0]
                == 0
            ),
            240,
            "every job ended",
        )
        assert all(w.poll() is None for w in workers), "a worker died in the failover"
        jobs = dict(_query(new, "SELECT id, state FROM django_gator_job"))
        missing = sorted(set(returned) - set(jobs))
        assert missing == [], f"jobs whose dispatch returned are gone: {missing[:20]}"
        not_done = {i: jobs[i] for i in returned if jobs[i] != "succeeded"}
        assert not_done == {}, not_done
        ledger = _query(new, "SELECT job_id, count(*) FROM testapp_execution GROUP BY job_id")
        runs = dict(ledger)
        atomic = [i for i, label in returned.items() if int(label[1:]) % 3 == 2]
        assert atomic, "the dispatcher sent atomic jobs"
        assert {i: runs.get(i, 0) for i in atomic if runs.get(i, 0) != 1} == {}, (
            "an atomic job's effects happened once each"
        )
        assert all(runs.get(i, 0) >= 1 for i in returned), "every plain job ran"
        rescued = _query(new, "SELECT count(*) FROM django_gator_job WHERE rescues > 0")[0][0]
        assert rescued == 0, "a pause shorter than the heartbeat timeout is not a lost worker"
        print(
            f"failover: {len(returned)} dispatches returned, "
            f"promote took {promoted_at - crashed_at:.2f} s, jobs ran again "
            f"{back_after:.2f} s after it; plain jobs run twice: "
            f"{sum(1 for i in returned if runs.get(i, 0) > 1)}"
        )


@pytest.mark.timeout(600)
def test_a_failover_to_an_asynchronous_standby_loses_exactly_what_it_had_not_received(
    tmp_path: Path,
):
    clusters = _clusters()
    with (
        clusters.throwaway_cluster() as primary,
        clusters.standby_of(primary, synchronous=False) as standby,
        _processes(tmp_path) as procs,
    ):
        env = _env(primary.url("gator"), f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}")
        _migrate(env, tmp_path / "migrate.log")
        before, after = tmp_path / "before", tmp_path / "after"
        first = _start(
            procs,
            ["-m", "tests.failover_dispatcher", str(before), "60", "30"],
            env,
            tmp_path / "before.log",
        )
        assert first.wait(timeout=120) == 0
        replicated = _wait(
            lambda: (
                primary.execute(
                    "SELECT count(*) FROM pg_stat_replication "
                    "WHERE replay_lsn = pg_current_wal_lsn()"
                )
                == "1"
            ),
            60,
            "the standby caught up",
        )
        # The standby stops receiving (as behind a slow or broken link): what the primary
        # commits from now on exists on the primary alone.
        standby.execute("ALTER SYSTEM SET primary_conninfo = ''")
        standby.execute("SELECT pg_reload_conf()")
        _wait(
            lambda: primary.execute("SELECT count(*) FROM pg_stat_replication") == "0",
            60,
            "replication cut",
        )
        second = _start(
            procs,
            ["-m", "tests.failover_dispatcher", str(after), "60", "20"],
            env,
            tmp_path / "after.log",
        )
        assert second.wait(timeout=120) == 0, "with an asynchronous standby, commits go on"

        primary.stop("immediate")
        standby.promote()
        ids = {row[0] for row in _query(_conninfo(standby.port), "SELECT id FROM django_gator_job")}

        kept, lost = _returned(before), _returned(after)
        assert len(kept) == 30
        assert len(lost) == 20
        assert set(kept) <= ids, "everything the standby had received is there"
        assert not set(lost) & ids, "the dispatches after the cut returned, and are lost"
        print(f"asynchronous failover: {len(lost)} returned dispatches lost ({replicated:.2f} s)")
