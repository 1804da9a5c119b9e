"""Metrics of workflows' waits and signals (issue 34, item 5): the open waits and sleeps
by queue, the age of the oldest wait, and the signals sent by outcome, scraped over HTTP
from ``django_gator.metrics.view`` served by a real WSGI server in this process."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_gator import Workflow
from django_gator.exceptions import WorkflowError
from django_gator.metrics.workflows import wait_figures
from django_gator.models import WorkflowRun
from tests.conftest import PARTITIONED_SUITE, analyze, run_worker
from tests.engines.test_contract_plans import explain
from tests.factories import JobFactory
from tests.test_metrics import Samples, value
from tests.test_metrics import scrape as scrape_port
from tests.testapp.jobs import Gathers, Produces

pytestmark = pytest.mark.django_db(transaction=True)


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def server() -> Iterator[WSGIServer]:
    """The project's WSGI application on a free port of 127.0.0.1, in a thread."""
    httpd = make_server("127.0.0.1", 0, WSGIHandler(), handler_class=_Quiet)
    thread = threading.Thread(target=httpd.serve_forever, name="wsgi", daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def scrape(httpd: WSGIServer) -> Samples:
    return scrape_port(httpd.server_port, "/gator-metrics/")


def _waiting(name: str) -> WorkflowRun:
    """A workflow whose wait for "approved" and whose hour-long sleep are reached."""
    wf = Workflow(name=name)
    wf.add(Produces, 1, name="first")
    wf.add_wait("approved", after=["first"], timeout=timedelta(days=3), name="approval")
    wf.add_sleep(timedelta(hours=1), after=["first"], name="pause")
    wf.add(Gathers, after=["approval"], name="last")
    run = wf.dispatch()
    return run


@override_settings(GATOR_METRICS_CACHE_SECONDS=0)
def test_open_waits_sleeps_and_signals_by_outcome_are_scraped_over_http(server):
    before = scrape(server)
    signals = {o: value(before, "gator_workflow_signals_total", outcome=o) for o in OUTCOMES}
    one, two = _waiting("order 1"), _waiting("order 2")
    run_worker("results")

    reached = scrape(server)
    assert value(reached, "gator_workflow_open_waits", queue="results") == 2
    assert value(reached, "gator_workflow_open_sleeps", queue="results") == 2
    assert 0 <= value(reached, "gator_workflow_oldest_wait_age_seconds", queue="results") < 60

    assert one.signal("approved", {"ok": True}) is True
    assert one.signal("approved", {"ok": False}) is False
    assert two.reject("approved", by="ops") is True
    with pytest.raises(WorkflowError):
        two.signal("shipped")
    run_worker("results")

    after = scrape(server)
    assert value(after, "gator_workflow_open_waits", queue="results") == 0
    assert value(after, "gator_workflow_oldest_wait_age_seconds", queue="results") == 0
    assert value(after, "gator_workflow_open_sleeps", queue="results") == 2
    moved = {
        o: value(after, "gator_workflow_signals_total", outcome=o) - signals[o] for o in OUTCOMES
    }
    assert moved == {"delivered": 1, "rejected": 1, "duplicate": 1, "refused": 1}


OUTCOMES = ("delivered", "rejected", "duplicate", "refused")


@override_settings(GATOR_METRICS_CACHE_SECONDS=0)
@pytest.mark.skipif(connection.vendor == "mysql", reason="no partial indexes: the state index")
def test_the_gauges_read_the_open_steps_alone_not_every_unfinished_job():
    """Migration 0029's partial index holds the unfinished sleep and wait steps only: the
    gauges' statement reads it, however many other jobs wait or run (before it, the
    statement read every unfinished row: 295-626 ms of a /metrics scrape at 5,000,000 rows,
    docs/benchmarks.md)."""
    _waiting("order 1")
    run_worker("results")
    JobFactory.create_batch(2000)  # waiting jobs of other names
    JobFactory.create_batch(300, running=True)
    analyze()
    with CaptureQueriesContext(connection) as queries:
        figures = wait_figures("default")
    assert figures["queues"]["results"]["waits"] == 1
    assert figures["queues"]["results"]["sleeps"] == 1
    [query] = [q["sql"] for q in queries.captured_queries if "django_gator_job" in q["sql"]]
    plan = explain(query)
    assert "gator_job_open_steps" in plan, plan
    if connection.vendor == "postgresql":
        # No other index of the jobs table, no table scan: the open steps' entries alone.
        assert "Seq Scan" not in plan, plan
        assert plan.count("Index") == plan.count("open_steps"), plan
        if PARTITIONED_SUITE:
            assert "django_gator_job_active" in plan, plan
            assert "_done" not in plan, plan
    else:
        assert re.search(r"USING (COVERING )?INDEX gator_job_open_steps\b", plan), plan
        job_lines = [line for line in plan.splitlines() if "django_gator_job" in line]
        assert all("INDEX" in line for line in job_lines), plan


@pytest.mark.skipif(connection.vendor != "postgresql", reason="CREATE INDEX CONCURRENTLY")
def test_the_open_steps_migration_builds_concurrently_where_the_rows_are():
    """PostgreSQL builds 0029's index without blocking writers: on the plain table, or on
    the active partition of partitioned storage (a partitioned parent cannot be indexed
    concurrently); dropped and built again, it is back where it was and valid."""
    from django.apps import apps as registry

    from django_gator.engines import schema_concurrent

    def where() -> tuple[str, bool] | None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT i.indrelid::regclass::text, i.indisvalid FROM pg_index i"
                " WHERE i.indexrelid = to_regclass('gator_job_open_steps')"
            )
            row = cursor.fetchone()
        return None if row is None else (row[0], bool(row[1]))

    table = "django_gator_job_active" if PARTITIONED_SUITE else "django_gator_job"
    assert where() == (table, True)
    with connection.schema_editor(atomic=False) as editor:
        schema_concurrent.drop_open_steps_index(registry, editor)
    assert where() is None
    with connection.schema_editor(atomic=False) as editor:
        schema_concurrent.create_open_steps_index(registry, editor)
    assert where() == (table, True)
