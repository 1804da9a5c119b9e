"""Prometheus metrics: a real worker's /metrics over HTTP, several processes behind one
endpoint, the queues' view and its cache, and the startup errors."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import caches
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from django_gator import conf, metrics, pause_queue
from django_gator.dbtime import DbNow
from django_gator.engines import get_engine
from django_gator.expiry import settle_expired
from django_gator.models import Job, JobState
from tests.conftest import (
    PARTITIONED_SUITE,
    ROOT,
    analyze,
    plain_table_only,
    run_python,
    run_worker,
    stop_worker,
    wait_for,
    worker_env,
    worker_output,
)
from tests.engines.test_contract_plans import explain
from tests.factories import JobFactory
from tests.testapp.jobs import Boom, Noop, RecordFailsFirst, Sleep

pytestmark = pytest.mark.django_db(transaction=True)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int, path: str = "/metrics") -> Samples:
    """Every sample of the endpoint, parsed by prometheus_client's parser."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value, 0 when the endpoint does not have it (yet)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def all_done(count: int) -> bool:
    final = (JobState.SUCCEEDED, JobState.DEAD)
    return Job.objects.filter(state__in=final).count() == count


def test_a_real_workers_metrics_move_by_exactly_the_jobs_it_runs(spawn_worker, tmp_path):
    port = free_port()
    proc = spawn_worker("-q", "metrics", "--concurrency", "3", "--metrics-port", str(port))
    wait_for(lambda: _answers(port), timeout=60)
    before = scrape(port)
    assert value(before, "gator_worker_threads") == 3

    Noop.dispatch_many([[]] * 20, queue="metrics")
    Boom.dispatch_many([["no"]] * 3, queue="metrics")
    wait_for(lambda: all_done(23), timeout=60)
    during = scrape(port)  # the worker is running; more jobs follow
    RecordFailsFirst.dispatch_many([[f"r{i}"] for i in range(4)], queue="metrics")
    Noop.dispatch_many([[]] * 10, queue="metrics")
    wait_for(lambda: all_done(37), timeout=60)
    after = scrape(port)

    noop, boom, flaky = Noop.name, Boom.name, RecordFailsFirst.name

    def finished(samples: Samples, job: str, outcome: str) -> float:
        return value(
            samples, "gator_jobs_finished_total", job=job, queue="metrics", outcome=outcome
        )

    def runs(samples: Samples, job: str) -> float:
        return value(samples, "gator_job_run_seconds_count", job=job, queue="metrics")

    assert finished(during, noop, "succeeded") - finished(before, noop, "succeeded") == 20
    assert finished(during, boom, "dead") - finished(before, boom, "dead") == 3
    assert finished(after, noop, "succeeded") - finished(during, noop, "succeeded") == 10
    assert finished(after, flaky, "failed") - finished(during, flaky, "failed") == 4
    assert finished(after, flaky, "succeeded") - finished(during, flaky, "succeeded") == 4
    assert finished(after, boom, "dead") == finished(during, boom, "dead")
    assert runs(after, noop) - runs(before, noop) == 30
    assert runs(after, flaky) - runs(during, flaky) == 8
    assert runs(after, boom) - runs(before, boom) == 3
    pickups = "gator_job_pickup_latency_seconds_count"
    assert value(after, pickups, queue="metrics") - value(before, pickups, queue="metrics") == 41
    # Buckets are cumulative: the +Inf bucket holds every observation.
    inf = value(after, "gator_job_run_seconds_bucket", job=noop, queue="metrics", le="+Inf")
    assert inf == runs(after, noop)
    beat = ("gator_worker_heartbeat_age_seconds", ())
    wait_for(lambda: 0 <= scrape(port).get(beat, -1) < 30, timeout=30)
    # Busy threads, sampled at each heartbeat: two jobs running, then none.
    Sleep.dispatch_many([[3.0, "busy"]] * 2, queue="metrics")
    wait_for(lambda: value(scrape(port), "gator_worker_busy_threads") == 2, timeout=30)
    wait_for(lambda: all_done(39), timeout=60)
    wait_for(lambda: value(scrape(port), "gator_worker_busy_threads") == 0, timeout=30)
    stop_worker(proc)


def _answers(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


def test_a_busy_metrics_port_is_a_clear_startup_error(spawn_worker):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = spawn_worker("--metrics-port", str(port))
        assert proc.wait(timeout=60) == 2
    output = worker_output(proc)
    assert f"cannot serve metrics on port {port}" in output, output
    assert not Job.objects.exists()


def test_a_metrics_port_out_of_range_is_refused(spawn_worker):
    proc = spawn_worker("--metrics-port", "70000")
    assert proc.wait(timeout=60) == 2
    assert "70000" in worker_output(proc)


CHILD = textwrap.dedent(
    """
    import django, sys
    django.setup()
    from django_gator import metrics
    from django_gator.worker.supervisor import WorkerProcess
    from django_gator.worker.queues import parse_queue_specs
    metrics.enable()
    worker = WorkerProcess(parse_queue_specs([sys.argv[1]]), concurrency=2, burst=True,
                           install_signal_handlers=False)
    metrics.track(worker.concurrency, lambda: len(worker.slots.running))
    worker.run()
    """
)


@pytest.fixture
def multiprocess_dir(tmp_path: Path) -> Iterator[str]:
    from prometheus_client import values

    saved, value_class = os.environ.get(metrics.MULTIPROC_ENV), values.ValueClass
    yield str(tmp_path / "prom")
    values.ValueClass = value_class
    if saved is None:
        os.environ.pop(metrics.MULTIPROC_ENV, None)
    else:
        os.environ[metrics.MULTIPROC_ENV] = saved


def test_one_endpoint_covers_worker_processes_sharing_a_multiprocess_dir(multiprocess_dir):
    """What a supervisor does: prepare the directory, start children that enable metrics,
    serve the sum from the parent, mark a child dead when it exits. Here the children are
    two burst workers on two queues, and this process serves."""
    path = metrics.prepare_multiprocess_dir(multiprocess_dir)
    Noop.dispatch_many([[]] * 7, queue="mp-a")
    Boom.dispatch_many([[]] * 2, queue="mp-b")
    Noop.dispatch_many([[]] * 5, queue="mp-b")
    env = worker_env(PROMETHEUS_MULTIPROC_DIR=path)
    children = [
        subprocess.Popen([sys.executable, "-c", CHILD, queue], cwd=ROOT, env=env)
        for queue in ("mp-a", "mp-b")
    ]
    server = metrics.serve(0, "127.0.0.1")
    try:
        for child in children:
            assert child.wait(timeout=120) == 0
        samples = scrape(server.port)
        finished = "gator_jobs_finished_total"
        assert value(samples, finished, job=Noop.name, queue="mp-a", outcome="succeeded") == 7
        assert value(samples, finished, job=Noop.name, queue="mp-b", outcome="succeeded") == 5
        assert value(samples, finished, job=Boom.name, queue="mp-b", outcome="dead") == 2
        pickups = "gator_job_pickup_latency_seconds_count"
        assert value(samples, pickups, queue="mp-a") + value(samples, pickups, queue="mp-b") == 14
        # The children's threads count while they are live, not after they are marked dead.
        assert value(samples, "gator_worker_threads") == 4
        for child in children:
            metrics.mark_dead(child.pid)
        samples = scrape(server.port)
        assert value(samples, "gator_worker_threads") == 0
        assert value(samples, finished, job=Noop.name, queue="mp-a", outcome="succeeded") == 7
    finally:
        server.close()
        for child in children:
            if child.poll() is None:
                child.kill()


def test_an_empty_process_file_does_not_fail_the_scrape(multiprocess_dir):
    # A process's file exists at 0 bytes between its creation and its sizing; a process
    # SIGKILLed then leaves it so. prometheus_client's collector failed the whole scrape.
    path = metrics.prepare_multiprocess_dir(multiprocess_dir)
    env = worker_env(PROMETHEUS_MULTIPROC_DIR=path)
    Noop.dispatch_many([[]] * 3, queue="mp-a")
    child = subprocess.Popen([sys.executable, "-c", CHILD, "mp-a"], cwd=ROOT, env=env)
    assert child.wait(timeout=120) == 0
    Path(path, "counter_999999.db").touch()  # the file of a process killed at its start
    server = metrics.serve(0, "127.0.0.1")
    try:
        samples = scrape(server.port)
        finished = "gator_jobs_finished_total"
        assert value(samples, finished, job=Noop.name, queue="mp-a", outcome="succeeded") == 3
    finally:
        server.close()


def test_job_metrics_in_process_and_the_outcome_labels():
    metrics.enable()
    try:
        from prometheus_client import REGISTRY

        def count(outcome: str, job: str) -> float:
            got = REGISTRY.get_sample_value(
                "gator_jobs_finished_total", {"job": job, "queue": "inproc", "outcome": outcome}
            )
            return got or 0.0

        base_ok, base_dead = count("succeeded", Noop.name), count("dead", Boom.name)
        Noop.dispatch_many([[]] * 4, queue="inproc")
        Boom.dispatch(queue="inproc")
        run_worker("inproc")
        assert count("succeeded", Noop.name) - base_ok == 4
        assert count("dead", Boom.name) - base_dead == 1
    finally:
        metrics.disable()


def test_the_expiry_sweep_counts_expired_jobs_under_their_own_outcome():
    metrics.enable()
    try:
        from prometheus_client import REGISTRY

        labels = {"job": Noop.name, "queue": "expiring", "outcome": "expired"}
        before = REGISTRY.get_sample_value("gator_jobs_finished_total", labels) or 0.0
        jobs = Noop.dispatch_many([[]] * 3, queue="expiring", expires_at=timezone.now())
        Job.objects.filter(pk__in=[j.pk for j in jobs]).update(expires_at=DbNow())
        assert settle_expired(conf.database()) == 3
        assert REGISTRY.get_sample_value("gator_jobs_finished_total", labels) == before + 3
    finally:
        metrics.disable()


# -- the queues' view ------------------------------------------------------------------------
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}


@override_settings(CACHES=CACHES, GATOR_METRICS_CACHE_SECONDS=60)
def test_the_view_serves_queue_gauges_and_reads_the_database_once_per_interval(
    django_assert_max_num_queries,
):
    caches["default"].clear()
    Noop.dispatch_many([[]] * 3, queue="view-a")
    Noop.dispatch(queue="view-a", wait=3600)
    Boom.dispatch(queue="view-b")
    run_worker("view-b")
    pause_queue("view-b")
    client = Client()
    response = client.get("/gator-metrics/")
    assert response.status_code == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }
    assert value(samples, "gator_queue_ready_jobs", queue="view-a") == 3
    assert value(samples, "gator_queue_scheduled_jobs", queue="view-a") == 1
    assert value(samples, "gator_queue_dead_jobs", queue="view-b") == 1
    assert value(samples, "gator_queue_paused", queue="view-b") == 1
    assert value(samples, "gator_queue_paused", queue="view-a") == 0
    assert 0 <= value(samples, "gator_queue_oldest_due_age_seconds", queue="view-a") < 60
    # Further scrapes within the interval are served from the cache: no query at all.
    Noop.dispatch(queue="view-a")
    with django_assert_max_num_queries(0):
        for _ in range(5):
            assert client.get("/gator-metrics/").status_code == 200
    again = client.get("/gator-metrics/").content.decode()
    assert 'gator_queue_ready_jobs{queue="view-a"} 3.0' in again


@override_settings(CACHES=CACHES, GATOR_METRICS_CACHE_SECONDS=60)
def test_a_stale_figure_is_refreshed_by_one_scraper_while_the_others_serve_it():
    cache = caches["default"]
    cache.clear()
    Noop.dispatch(queue="stale")
    first = metrics.queue_figures()
    # The figures turn stale; a replica holds the refresh lock: this one serves them.
    cache.set("django_gator:metrics:queues:default", {**first, "at": first["at"] - 120})
    cache.add("django_gator:metrics:queues:default:refresh", 1)
    Noop.dispatch(queue="stale")
    served = metrics.queue_figures()
    assert served["at"] == first["at"] - 120
    # The lock expires (here: is released): the next scrape reads the database.
    cache.delete("django_gator:metrics:queues:default:refresh")
    fresh = metrics.queue_figures()
    assert fresh["at"] > served["at"]
    assert [q["ready"] for q in fresh["queues"] if q["queue"] == "stale"] == [2]


def test_the_view_reads_the_database_every_time_with_no_cache_interval():
    with override_settings(GATOR_METRICS_CACHE_SECONDS=0):
        Noop.dispatch(queue="nocache")
        assert metrics.queue_figures()["queues"][0]["ready"] == 1
        Noop.dispatch(queue="nocache")
        assert metrics.queue_figures()["queues"][0]["ready"] == 2


def _gauges_history() -> None:
    """Queues in every state the gauges count, beside finished jobs they must not: g-a has
    ready jobs with and without a concurrency key (each in its own partial index), due
    failed jobs, scheduled ones of both kinds and two running ones; g-b dead jobs; g-c only
    finished jobs; g-d is paused and empty."""
    now = timezone.now()
    JobFactory.create_batch(3, queue="g-a", next_execution_at=now - timedelta(seconds=30))
    JobFactory(queue="g-a", concurrency_key="acct:1", next_execution_at=now - timedelta(hours=2))
    JobFactory(queue="g-a", failed=True, next_execution_at=now - timedelta(seconds=5))
    JobFactory(queue="g-a", failed=True)  # due in a minute
    JobFactory(queue="g-a", scheduled=True, concurrency_key="acct:2")
    JobFactory(queue="g-a", scheduled=True)
    JobFactory(queue="g-a", running=True, locked_at=now - timedelta(minutes=30))
    JobFactory(queue="g-a", running=True)
    JobFactory.create_batch(2, queue="g-b", dead=True)
    JobFactory(queue="g-b", succeeded=True)
    JobFactory(queue="g-b", cancelled=True)
    JobFactory.create_batch(3, queue="g-c", succeeded=True)
    pause_queue("g-d")


@override_settings(GATOR_METRICS_CACHE_SECONDS=0)
def test_a_refresh_of_the_queue_figures_is_one_statement_and_its_figures_are_right():
    _gauges_history()
    connection.ensure_connection()
    with CaptureQueriesContext(connection) as captured:
        figures = metrics.queue_figures()
    assert len(captured) == 1, [q["sql"] for q in captured.captured_queries]
    by_queue = {q.pop("queue"): q for q in figures["queues"]}
    oldest = {name: q.pop("oldest_due") for name, q in by_queue.items()}
    running = {name: q.pop("oldest_running") for name, q in by_queue.items()}
    assert by_queue == {
        "g-a": {"ready": 5, "scheduled": 3, "running": 2, "dead": 0, "paused": False},
        "g-b": {"ready": 0, "scheduled": 0, "running": 0, "dead": 2, "paused": False},
        "g-d": {"ready": 0, "scheduled": 0, "running": 0, "dead": 0, "paused": True},
    }
    # The oldest due job is the keyed one, two hours late, on the database's clock.
    assert 7200 <= figures["db_now"] - oldest["g-a"] < 7200 + 60
    assert oldest["g-b"] is None
    assert oldest["g-d"] is None
    # The oldest running job's claim, half an hour ago, read in the same statement.
    assert 1800 <= figures["db_now"] - running["g-a"] < 1800 + 60
    assert running["g-b"] is None
    assert abs(figures["db_now"] - time.time()) < 60
    # The gauge Prometheus sees.
    collected = {
        (s.name, s.labels.get("queue")): s.value
        for family in metrics.QueueCollector().collect()
        for s in family.samples
    }
    assert 7200 <= collected[("gator_queue_oldest_due_age_seconds", "g-a")] < 7200 + 60
    assert collected[("gator_queue_oldest_due_age_seconds", "g-b")] == 0
    assert 1800 <= collected[("gator_queue_oldest_running_age_seconds", "g-a")] < 1800 + 60
    assert collected[("gator_queue_oldest_running_age_seconds", "g-b")] == 0
    assert collected[("gator_queue_ready_jobs", "g-a")] == 5
    assert collected[("gator_queue_paused", "g-d")] == 1


def test_each_part_of_the_queue_figures_statement_reads_an_index():
    """With a history of finished jobs, no part of the statement reads the jobs table
    itself from end to end."""
    _gauges_history()
    JobFactory.create_batch(2000, succeeded=True)
    analyze()
    sql = get_engine("default").queue_gauges_sql()
    plan = explain(sql)
    if PARTITIONED_SUITE:
        # Partitioned storage: the finished jobs are in partitions of their own, which no
        # part reads; the active and dead partitions hold only the rows of their states.
        assert "django_gator_job_done" not in plan, plan
        return
    if connection.vendor == "postgresql":
        scans = _pg_job_scans(sql)  # none of them a Seq Scan
        # One index read per part. Which index serves the dead part (its own partial one,
        # or another entered by the state) is the planner's choice by the statistics.
        assert len(scans) == len(GAUGE_INDEXES), plan
        for scan in scans:
            # A partial index holds only the rows of its states; another index must be
            # entered by a condition (on the state).
            assert scan["Index Name"] in PARTIAL or "Index Cond" in scan, plan
    elif connection.vendor == "sqlite":
        # A scan of a partial index: its entries are the rows of its state only.
        for index in GAUGE_INDEXES:
            assert re.search(rf"USING (COVERING )?INDEX {index}\b", plan), plan
        job_lines = [line for line in plan.splitlines() if "django_gator_job" in line]
        assert all("INDEX" in line for line in job_lines), plan
    else:
        job_rows = [line for line in plan.splitlines() if "django_gator_job" in line]
        assert len(job_rows) == 3, plan
        assert all("'key': None" not in line for line in job_rows), plan


@pytest.mark.skipif(connection.vendor != "postgresql", reason="CREATE INDEX CONCURRENTLY")
@plain_table_only
def test_the_dead_queue_index_migration_rebuilds_an_index_left_invalid():
    """A CONCURRENTLY build that failed half-way leaves an invalid index, which the
    planner never uses; running the migration's step again replaces it."""
    from django.apps import apps as registry

    from django_gator.engines import schema

    def valid() -> bool | None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = "
                "to_regclass('gator_job_dead_queue')"
            )
            row = cursor.fetchone()
        return None if row is None else bool(row[0])

    assert valid() is True
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pg_index SET indisvalid = false "
            "WHERE indexrelid = to_regclass('gator_job_dead_queue')"
        )
    assert valid() is False
    with connection.schema_editor(atomic=False) as editor:
        schema.create_dead_queue_index(registry, editor)
    assert valid() is True
    with connection.schema_editor(atomic=False) as editor:
        schema.drop_dead_queue_index(registry, editor)
    assert valid() is None
    with connection.schema_editor(atomic=False) as editor:
        schema.create_dead_queue_index(registry, editor)
    assert valid() is True


#: The partial indexes the parts read, on PostgreSQL and SQLite (a planner may also prefer
#: the (state, finished_at) index for a part; at this table's size they do not).
GAUGE_INDEXES = (
    "gator_job_ready",
    "gator_job_ready_keyed",
    "gator_job_running_queue",
    "gator_job_dead_queue",
)
#: PostgreSQL's partial indexes of the jobs table.
PARTIAL = {
    "gator_job_dead_queue",
    "gator_job_ready",
    "gator_job_ready_keyed",
    "gator_job_running",
    "gator_job_running_queue",
    "gator_job_running_keyed",
    "gator_job_groups",
}


def _pg_job_scans(sql: str) -> list[dict[str, Any]]:
    """The index scans of the jobs table in PostgreSQL's plan of ``sql`` (a bitmap heap
    scan stands for the index scans under it)."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
        [[document]] = cursor.fetchall()
    plan = json.loads(document) if isinstance(document, str) else document
    scans: list[dict[str, Any]] = []

    def walk(node: dict[str, Any]) -> None:
        on_jobs = node.get("Relation Name") == "django_gator_job"
        assert not (on_jobs and node["Node Type"] == "Seq Scan"), node
        if node["Node Type"] == "Bitmap Index Scan" or (on_jobs and "Index Name" in node):
            scans.append(node)
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return scans


def test_health_file_in_a_missing_directory_is_a_clear_startup_error(spawn_worker, tmp_path):
    missing = tmp_path / "no-such-dir" / "alive"
    proc = spawn_worker("--health-file", str(missing))
    assert proc.wait(timeout=60) == 2
    output = worker_output(proc)
    assert str(missing) in output, output
    assert "does not exist" in output, output


def test_a_worker_without_metrics_does_not_import_prometheus_client():
    """The worker's modules, the hooks and dispatch do not load prometheus_client until
    metrics are asked for."""
    code = (
        "import django, sys; django.setup();"
        "import django_gator.worker.supervisor, django_gator.dispatch,"
        " django_gator.management.commands.gator_worker;"
        "print(sorted(m for m in sys.modules if m.startswith('prometheus')))"
    )
    assert run_python(code).strip() == "[]"


def test_a_process_supervisor_serves_one_endpoint_for_all_its_workers(spawn_worker):
    port = free_port()
    proc = spawn_worker(
        "-q", "metrics", "--processes", "2", "--concurrency", "2", "--metrics-port", str(port)
    )
    wait_for(lambda: _answers(port), timeout=120)
    # Both worker processes report their threads into the supervisor's one endpoint.
    wait_for(lambda: value(scrape(port), "gator_worker_threads") == 4, timeout=120)

    Noop.dispatch_many([[]] * 40, queue="metrics")
    wait_for(lambda: all_done(40), timeout=120)

    samples = scrape(port)
    finished = value(
        samples, "gator_jobs_finished_total", job=Noop.name, queue="metrics", outcome="succeeded"
    )
    assert finished == 40
    assert value(samples, "gator_job_run_seconds_count", job=Noop.name, queue="metrics") == 40
    # The supervisor has no worker row (stop_worker waits for one): SIGTERM it directly.
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, worker_output(proc)
    with pytest.raises(urllib.error.URLError):
        scrape(port)  # the endpoint went with the supervisor
