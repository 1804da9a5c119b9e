"""Middleware, the on_error hook and the job signals, run by a real (in-process) worker."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.core import checks
from django.test import override_settings

from django_gator import Queueable, signals
from django_gator.models import Job, JobState
from tests.conftest import run_worker
from tests.testapp.jobs import (
    TRACE,
    BrokenHook,
    FailsWithHook,
    Noop,
    SkippedByMiddleware,
    UniqueReport,
    Wrapped,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def clean_trace() -> Iterator[None]:
    TRACE.clear()
    yield
    TRACE.clear()


def test_class_middleware_wraps_handle_in_order_and_can_change_the_result():
    job = Wrapped.dispatch(21, tenant="acme")
    run_worker()

    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert job.result == 42  # doubled by the inner middleware
    assert TRACE == [("tenant:set", "acme"), ("handle", "acme")]


@override_settings(GATOR_MIDDLEWARE=["tests.testapp.jobs.outer_middleware"])
def test_global_middleware_runs_outside_the_class_middleware_for_every_job():
    wrapped = Wrapped.dispatch(1, tenant="t1")
    plain = Noop.dispatch()
    run_worker(concurrency=1)

    for job in (wrapped, plain):
        assert job.refresh_state() == JobState.SUCCEEDED
    start = TRACE.index(("outer:before", wrapped.pk, 1))
    assert TRACE[start : start + 4] == [
        ("outer:before", wrapped.pk, 1),
        ("tenant:set", "t1"),
        ("handle", "t1"),
        ("outer:after", wrapped.pk),
    ]
    assert ("outer:before", plain.pk, 1) in TRACE
    assert ("outer:after", plain.pk) in TRACE


@override_settings(GATOR_MIDDLEWARE=["tests.testapp.jobs.TenantMiddleware"])
def test_a_middleware_class_path_is_instantiated_once():
    Noop.dispatch(tenant="x")
    run_worker()
    assert TRACE == [("tenant:set", "x")]


def test_middleware_may_skip_the_handler():
    job = SkippedByMiddleware.dispatch()
    run_worker()
    job.refresh_from_db()
    assert (job.state, job.result) == (JobState.SUCCEEDED, "skipped")


@override_settings(GATOR_MIDDLEWARE=["tests.testapp.jobs.no_such_middleware"])
def test_a_bad_middleware_path_is_a_system_check_error():
    errors = [e for e in checks.run_checks() if e.id == "django_gator.E003"]
    assert len(errors) == 1
    assert "tests.testapp.jobs.no_such_middleware" in errors[0].msg


def test_middleware_must_be_callables():
    with pytest.raises(TypeError, match="middleware must be a list of callables"):

        class BadMiddleware(Queueable):
            name = "tests.BadMiddleware"
            middleware = ["tests.testapp.jobs.outer_middleware"]

            def handle(self) -> None:
                return None


def test_on_error_runs_after_each_failed_attempt():
    job = FailsWithHook.dispatch("x")
    run_worker()

    job.refresh_from_db()
    assert job.state == JobState.DEAD
    assert [
        ("on_error", job.pk, 1, "KeyError"),
        ("on_error", job.pk, 2, "KeyError"),
    ] == TRACE
    assert len(job.errors) == 2


def test_an_on_error_that_raises_is_logged_and_the_failure_still_recorded(caplog):
    job = BrokenHook.dispatch()
    follower = Noop.dispatch()
    with caplog.at_level(logging.ERROR, logger="django_gator.worker"):
        run_worker(concurrency=1)

    job.refresh_from_db()
    assert job.state == JobState.DEAD
    assert job.last_error == "ValueError: job failed"
    assert follower.refresh_state() == JobState.SUCCEEDED
    assert any("on_error() raised" in r.getMessage() for r in caplog.records)


class Received:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, signal_name: str) -> Any:
        def receiver(sender: Any, **kwargs: Any) -> None:
            self.calls.append((signal_name, {"sender": sender, **kwargs}))

        return receiver


def test_signals_report_dispatch_start_and_finish():
    received = Received()
    on_dispatch, on_start, on_finish = (
        received("dispatched"),
        received("started"),
        received("finished"),
    )
    signals.job_dispatched.connect(on_dispatch)
    signals.job_started.connect(on_start, sender=FailsWithHook)
    signals.job_finished.connect(on_finish)
    try:
        ok = Noop.dispatch()
        failing = FailsWithHook.dispatch("k")
        run_worker(concurrency=1)
    finally:
        signals.job_dispatched.disconnect(on_dispatch)
        signals.job_started.disconnect(on_start, sender=FailsWithHook)
        signals.job_finished.disconnect(on_finish)

    dispatched = [kw for name, kw in received.calls if name == "dispatched"]
    assert [(kw["sender"], [j.pk for j in kw["jobs"]]) for kw in dispatched] == [
        (Noop, [ok.pk]),
        (FailsWithHook, [failing.pk]),
    ]
    started = [kw for name, kw in received.calls if name == "started"]
    assert [(kw["sender"], kw["job"].job_id, kw["job"].attempt) for kw in started] == [
        (FailsWithHook, failing.pk, 1),
        (FailsWithHook, failing.pk, 2),
    ]
    finished = [kw for name, kw in received.calls if name == "finished"]
    summary = [
        (kw["sender"], kw["job"].job_id, kw["state"], type(kw["exception"]).__name__)
        for kw in finished
    ]
    assert (Noop, ok.pk, "succeeded", "NoneType") in summary
    assert [s for s in summary if s[0] is FailsWithHook] == [
        (FailsWithHook, failing.pk, "failed", "KeyError"),
        (FailsWithHook, failing.pk, "dead", "KeyError"),
    ]
    assert all(kw["duration"] >= 0 for kw in finished)


def test_a_unique_duplicate_is_not_reported_as_dispatched():
    received = Received()
    receiver = received("dispatched")
    signals.job_dispatched.connect(receiver, sender=UniqueReport)
    try:
        UniqueReport.dispatch(1)
        UniqueReport.dispatch(1)
        UniqueReport.dispatch_many([[1], [2]])
    finally:
        signals.job_dispatched.disconnect(receiver, sender=UniqueReport)
    assert [len(kw["jobs"]) for _, kw in received.calls] == [1, 1]


def test_a_receiver_that_raises_never_stops_dispatch_or_the_worker(caplog):
    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    for signal in (signals.job_dispatched, signals.job_started, signals.job_finished):
        signal.connect(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="django.dispatch"):
            job = Noop.dispatch()
            run_worker()
    finally:
        for signal in (signals.job_dispatched, signals.job_started, signals.job_finished):
            signal.disconnect(broken)

    assert job.refresh_state() == JobState.SUCCEEDED
    assert Job.objects.count() == 1
    logged = [r for r in caplog.records if r.name == "django.dispatch" and r.exc_info]
    assert [str(r.exc_info[1]) for r in logged] == ["receiver bug"] * 3
