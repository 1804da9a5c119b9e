"""The Celery-compatible front (issue 37, item 2): each task option and apply_async()
option that is mapped does, on the job it dispatches, what Celery's does; each one that
is not is refused with a message naming it. Jobs run through run_jobs() (the worker's
claim and outcome code, in this thread) or a real burst worker."""

from __future__ import annotations

import contextlib
import itertools
import random
import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from django_gator import get_job_class
from django_gator.celery import AsyncResult, NotSupported, TimeLimitExceeded, shared_task
from django_gator.celery.options import backoff_countdown, gator_rate
from django_gator.models import Job, JobState
from django_gator.testing import TooManyJobs, assert_dispatched, run_jobs
from tests.conftest import run_worker
from tests.testapp import celery_tasks as t

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clean():
    t.SEEN.clear()


def _row(result: AsyncResult) -> Job:
    return Job.objects.get(pk=int(result.id))


def _due_in(result: AsyncResult) -> float:
    return (_row(result).next_execution_at - timezone.now()).total_seconds()


def test_delay_dispatches_a_job_and_get_returns_its_result():
    result = t.add.delay(2, 3)
    row = _row(result)
    assert (row.name, row.args, row.state) == ("tests.testapp.celery_tasks.add", [2, 3], "waiting")
    assert result.state == "PENDING"
    assert not result.ready()
    assert_dispatched(t.add, 2, 3)  # the testing helpers take the task
    run_jobs()
    assert result.get(timeout=10) == 5
    assert (result.state, result.ready(), result.successful()) == ("SUCCESS", True, True)
    assert AsyncResult(result.id).result == 5


def test_bind_gives_the_request_of_the_job():
    result = t.who.delay("bind")
    run_jobs()
    assert result.get(timeout=5) == result.id
    assert t.SEEN["bind"] == [{"id": result.id, "retries": 0}]


def test_name_is_the_registered_job_name():
    result = t.renamed.delay()
    assert _row(result).name == "celery-tests.renamed"
    assert get_job_class("celery-tests.renamed") is t.renamed.job_class


def test_queue_and_priority_of_the_task_and_of_the_call():
    row = _row(t.on_emails.delay(1))
    assert (row.queue, row.priority) == ("emails", 7)
    row = _row(t.on_emails.apply_async((2,), queue="other", priority=-3))
    assert (row.queue, row.priority) == ("other", -3)
    run_worker("emails")
    assert Job.objects.get(pk=row.pk).state == JobState.WAITING  # not the worker's queue
    assert Job.objects.filter(queue="emails", state="succeeded").count() == 1


def test_higher_priority_runs_first():
    low = t.add.apply_async((1, 1), priority=1)
    high = t.add.apply_async((2, 2), priority=9)
    ran = run_jobs()
    assert [job.pk for job in ran] == [int(high.id), int(low.id)]


def test_self_retry_waits_default_retry_delay_then_fails_past_max_retries():
    result = t.retries_by_hand.delay("hand")
    run_jobs()
    assert result.state == "RETRY"
    assert 40 < _due_in(result) <= 42
    assert isinstance(result.result, t.Flaky | Exception)
    run_jobs(advance=100, raise_errors=False)  # reaches both retries, 42 s apart
    assert [seen["retries"] for seen in t.SEEN["hand"]] == [0, 1, 2]
    assert result.state == "FAILURE"
    with pytest.raises(t.Flaky, match="hand failed"):
        result.get(timeout=1)
    assert isinstance(result.get(timeout=1, propagate=False), t.Flaky)


def test_retry_max_retries_of_the_call_wins():
    result = t.retries_with_its_own_limit.delay("own")
    run_jobs()
    run_jobs(advance=2, raise_errors=False)
    assert len(t.SEEN["own"]) == 2
    assert result.state == "FAILURE"
    with pytest.raises(Exception, match="Can't retry") as caught:
        result.get(timeout=1)
    assert type(caught.value).__name__ == "MaxRetriesExceededError"


def test_autoretry_for_retries_the_listed_errors_only():
    flaky = t.autoretried.delay("f", "flaky")
    other = t.autoretried.delay("o", "key")
    run_jobs(raise_errors=False)
    assert flaky.state == "RETRY"
    assert 4 < _due_in(flaky) <= 5  # default_retry_delay
    assert other.state == "FAILURE"  # not listed: no retry, as in Celery
    with pytest.raises(KeyError):
        other.get(timeout=1)
    run_jobs(advance=12, raise_errors=False)
    assert len(t.SEEN["f"]) == 3  # max_retries=2
    assert flaky.state == "FAILURE"


def test_retry_backoff_doubles_up_to_retry_backoff_max():
    result = t.backs_off.delay("b")
    waits = []
    for _ in range(5):
        # Each retry is reached by moving the clock just past it (one run per call: the
        # next one may be due by that clock too, which TooManyJobs says).
        with contextlib.suppress(TooManyJobs):
            run_jobs(advance=waits[-1] + 0.5 if waits else None, max_jobs=1)
        waits.append(round(_due_in(result)))
    assert waits == [2, 4, 8, 10, 10]


def test_retry_jitter_draws_the_wait_from_zero_to_the_backoff():
    rng_seen = set()
    for retries in range(6):
        for _ in range(50):
            wait = backoff_countdown(t.backs_off_with_jitter.options, retries)
            assert 0 <= wait <= min(600, 2**retries)
            rng_seen.add(wait)
    assert len(rng_seen) > 5
    random.seed(1)
    result = t.backs_off_with_jitter.delay("j")
    with contextlib.suppress(TooManyJobs):  # a wait of 0 makes the retry due at once
        run_jobs(max_jobs=1)
    assert _row(result).errors[0]["message"] in (
        "Retry in 0s: Flaky('j')",
        "Retry in 1s: Flaky('j')",
    )


def test_rate_limit_is_a_flow_control_limit_across_workers():
    assert t.limited.job_class.rate_limit == "1/s"
    results = [t.limited.delay(n) for n in range(3)]
    run_worker("default", concurrency=3)
    starts = sorted(_row(result).started_at for result in results)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]
    assert all(gap >= 0.95 for gap in gaps), gaps  # as Celery spaces them: 1 s apart


@pytest.mark.parametrize(
    ("celery", "gator"),
    [
        ("1/s", "1/s"),
        ("60/m", "1/s"),
        ("3600/h", "1/s"),
        ("1/m", "1/m"),
        ("60/h", "1/m"),
        ("1/h", "1/h"),
        ("1", "1/s"),
        (1, "1/s"),
    ],
)
def test_rate_limits_whose_spacing_gator_expresses(celery, gator):
    assert gator_rate("here", celery) == gator


@pytest.mark.parametrize("rate", ["10/m", "2/s", "0.5/s", "100/h"])
def test_rate_limits_that_celery_spaces_otherwise_are_refused(rate):
    with pytest.raises(NotSupported, match=r"rate_limit=.*every .* s on each worker"):

        @shared_task(rate_limit=rate)
        def spaced():
            pass


def test_time_limit_fails_the_attempt_at_the_limit():
    result = t.overruns.delay()
    assert t.overruns.job_class.timeout == 0.5
    run_worker("default")
    assert result.state == "FAILURE"
    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=1)


def test_ignore_result_stores_no_result_and_acks_late_true_is_accepted():
    result = t.forgets.delay(21)
    run_jobs()
    assert result.state == "SUCCESS"
    assert _row(result).result is None
    assert result.get(timeout=1) is None


def test_task_expires_and_apply_async_expires():
    row = _row(t.expiring.delay())
    assert 58 < (row.expires_at - timezone.now()).total_seconds() <= 60
    soon = t.add.apply_async((1, 2), expires=30)
    assert 28 < (_row(soon).expires_at - timezone.now()).total_seconds() <= 30
    gone = t.add.apply_async((1, 2), countdown=5, expires=timezone.now() + timedelta(seconds=6))
    assert gone.state == "PENDING"
    Job.objects.filter(pk=int(gone.id)).update(expires_at=timezone.now())  # time passes
    assert int(gone.id) not in [job.pk for job in run_jobs(advance=10)]  # it never runs
    assert gone.state == "REVOKED"
    with pytest.raises(Exception, match="revoked") as caught:
        gone.get(timeout=1)
    assert type(caught.value).__name__ == "TaskRevokedError"


def test_countdown_and_eta():
    later = t.add.apply_async((1, 1), countdown=30)
    assert 28 < _due_in(later) <= 30
    at = timezone.now() + timedelta(minutes=5)
    assert abs((_row(t.add.apply_async((1, 1), eta=at)).next_execution_at - at).total_seconds()) < 1
    with pytest.raises(ValueError, match="countdown= or eta="):
        t.add.apply_async((1, 1), countdown=1, eta=at)


def test_get_times_out_with_timeout_error():
    result = t.add.delay(1, 1)
    with pytest.raises(TimeoutError):
        result.get(timeout=0.2)
    from django_gator.celery import TimeoutError as CeleryTimeout

    with pytest.raises(CeleryTimeout):
        result.get(timeout=0.1)


def test_states_pending_started_failure_revoked():
    assert AsyncResult("999999").state == "PENDING"  # unknown, as in Celery
    t.RELEASE.clear()
    t.STARTED.clear()
    blocked = t.blocks.delay()

    def work() -> None:
        try:
            run_worker("default")
        finally:
            connections.close_all()  # this thread's

    runner = threading.Thread(target=work, daemon=True)
    runner.start()
    assert t.STARTED.wait(20)
    assert blocked.state == "STARTED"
    t.RELEASE.set()
    runner.join(30)
    assert blocked.get(timeout=5) == "released"
    failed = t.fails.delay()
    run_jobs(raise_errors=False)
    assert (failed.state, failed.failed()) == ("FAILURE", True)
    with pytest.raises(ValueError, match="no good"):
        failed.get(timeout=1)
    assert "ValueError" in failed.traceback
    revoked = t.add.delay(1, 1)
    revoked.revoke()
    assert revoked.state == "REVOKED"
    with pytest.raises(NotSupported, match="terminate"):
        revoked.revoke(terminate=True)
