"""Metrics of workflows' waits and signals (issue 34, item 5): the open waits and sleeps
by queue, the age of the oldest wait, and the signals sent by outcome, scraped over HTTP
from ``django_gator.metrics.view`` served by a real WSGI server in this process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.test import override_settings

from django_gator import Workflow
from django_gator.exceptions import WorkflowError
from django_gator.models import WorkflowRun
from tests.conftest import run_worker
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
