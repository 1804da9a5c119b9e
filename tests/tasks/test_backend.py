"""Django's Tasks framework on django-gator: enqueue, get_result, statuses, errors,
retries, context, async, signals; run by the in-process worker and by gator_worker."""

from __future__ import annotations

import logging
import signal
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from django_gator.models import Job, JobState
from django_gator.tasks import (
    FRAMEWORK,
    GatorBackend,
    InvalidTaskError,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
    task_finished,
    task_started,
)
from tests.conftest import run_worker, wait_for, worker_output
from tests.testapp import tasks
from tests.testapp.jobs import Noop

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_framework_in_use_matches_the_django_version():
    import django

    expected = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
    assert expected == FRAMEWORK


def test_enqueue_writes_a_job_row_and_returns_a_ready_result():
    result = tasks.render_report.enqueue(7, fmt="csv")

    job = Job.objects.get()
    assert result.id == str(job.pk)
    assert result.status == TaskResultStatus.READY
    assert result.backend == "default"
    assert (job.name, job.args, job.kwargs) == (
        "tests.testapp.tasks.render_report",
        [7],
        {"fmt": "csv"},
    )
    assert (job.queue, job.priority) == ("tasks", 5)
    assert result.enqueued_at == job.created_at
    assert result.worker_ids == []


def test_get_result_after_a_run_reports_success_and_the_return_value():
    result = tasks.add_numbers.enqueue(2, 3)
    run_worker()

    done = tasks.add_numbers.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == 5
    assert done.is_finished
    assert done.attempts == 1
    assert len(done.worker_ids) == 1
    assert done.started_at is not None
    assert done.finished_at >= done.started_at
    assert done.last_attempted_at is not None
    assert done.errors == []

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_a_failing_task_retries_then_shows_failed_with_every_error():
    result = tasks.always_fails.enqueue("nope")
    run_worker()

    done = tasks.always_fails.get_result(result.id)
    assert done.status == TaskResultStatus.FAILED
    assert done.attempts == 3
    assert len(done.errors) == 3
    assert [e.exception_class for e in done.errors] == [RuntimeError] * 3
    assert all("RuntimeError: nope" in e.traceback for e in done.errors)
    with pytest.raises(ValueError, match="Task failed"):
        done.return_value
    assert Job.objects.get().state == JobState.DEAD


def test_a_task_waiting_for_its_retry_shows_as_ready():
    result = tasks.always_fails.enqueue("later")
    Job.objects.filter(pk=int(result.id)).update(
        state=JobState.FAILED,
        attempts=1,
        errors=[{"attempt": 1, "class": "RuntimeError", "worker": "w1", "traceback": "tb"}],
        next_execution_at=timezone.now() + timedelta(minutes=5),
    )
    again = tasks.always_fails.get_result(result.id)
    assert again.status == TaskResultStatus.READY
    assert again.attempts == 1
    assert again.errors[0].exception_class is RuntimeError


def test_without_a_policy_a_failing_task_fails_at_once():
    result = tasks.fails_without_retry.enqueue()
    run_worker()
    done = result.task.get_result(result.id)
    assert (done.status, done.attempts) == (TaskResultStatus.FAILED, 1)
    assert done.errors[0].exception_class is ValueError


def test_a_task_enqueued_in_a_rolled_back_transaction_never_runs():
    with transaction.atomic():
        result = tasks.add_numbers.enqueue(1, 1)
        assert Job.objects.filter(pk=int(result.id)).exists()
        transaction.set_rollback(True)
    run_worker()
    assert not Job.objects.exists()
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add_numbers.get_result(result.id)


def test_run_after_defers_the_job():
    when = timezone.now() + timedelta(hours=1)
    result = tasks.add_numbers.using(run_after=when).enqueue(1, 2)
    run_worker()
    job = Job.objects.get(pk=int(result.id))
    assert job.state == JobState.WAITING
    assert job.next_execution_at == when


def test_queues_are_validated_against_the_backends_queues():
    with pytest.raises(InvalidTaskError, match="nope"):
        tasks.add_numbers.using(queue_name="nope")
    result = tasks.add_numbers.using(queue_name="critical", priority=50).enqueue(1, 2)
    assert Job.objects.get(pk=int(result.id)).queue == "critical"
    assert Job.objects.get(pk=int(result.id)).priority == 50


def test_arguments_are_checked_as_json_and_against_the_signature():
    with pytest.raises(TypeError, match="arguments do not fit"):
        tasks.add_numbers.enqueue(1)
    with pytest.raises(TypeError, match=r"args\[0\] is a set"):
        tasks.add_numbers.enqueue({1}, 2)
    assert not Job.objects.exists()


def test_a_task_can_take_its_context():
    result = tasks.with_context.enqueue("ctx")
    run_worker()
    done = tasks.with_context.get_result(result.id)
    assert done.return_value == {"label": "ctx", "attempt": 1, "id": result.id}


def test_async_tasks_and_the_async_api():
    result = async_to_sync(tasks.async_multiply.aenqueue)(6, 7)
    run_worker()
    done = async_to_sync(tasks.async_multiply.aget_result)(result.id)
    assert done.return_value == 42


def test_per_task_timeout_and_retry_policy():
    result = tasks.too_slow.enqueue()
    run_worker()
    done = tasks.too_slow.get_result(result.id)
    assert done.status == TaskResultStatus.FAILED
    assert done.errors[0].exception_class_path == "django_gator.exceptions.JobTimeout"


def test_get_result_refuses_ids_that_are_not_tasks():
    job = Noop.dispatch()
    backend = GatorBackend("default", {})
    for bad in (str(job.pk), "999999", "not-a-number"):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(bad)


def test_the_frameworks_signals_are_sent_with_the_backend_as_sender():
    seen: list[tuple[str, Any, Any]] = []

    def receiver(name: str) -> Any:
        def handler(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((name, sender, task_result.status))

        return handler

    handlers = {
        "enqueued": receiver("enqueued"),
        "started": receiver("started"),
        "finished": receiver("finished"),
    }
    task_enqueued.connect(handlers["enqueued"])
    task_started.connect(handlers["started"])
    task_finished.connect(handlers["finished"])
    try:
        tasks.add_numbers.enqueue(1, 2)
        tasks.always_fails.enqueue("x")
        run_worker(concurrency=1)
    finally:
        task_enqueued.disconnect(handlers["enqueued"])
        task_started.disconnect(handlers["started"])
        task_finished.disconnect(handlers["finished"])

    assert {sender for _, sender, _ in seen} == {GatorBackend}
    names = [name for name, _, _ in seen]
    assert names.count("enqueued") == 2
    assert names.count("started") == 4  # 1 + three attempts of always_fails
    finished = [status for name, _, status in seen if name == "finished"]
    # One per task that ended: retries in between are not "finished".
    assert sorted(finished) == sorted([TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED])


def test_gator_worker_runs_tasks_found_by_autodiscovery(spawn_worker):
    result = tasks.render_report.enqueue(3)
    proc = spawn_worker("-q", "tasks")
    wait_for(lambda: Job.objects.get(pk=int(result.id)).state == JobState.SUCCEEDED)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, worker_output(proc)
    assert tasks.render_report.get_result(result.id).return_value == {
        "report": 3,
        "format": "pdf",
    }


def test_the_per_task_read_is_skipped_when_only_the_frameworks_logging_listens():
    from django_gator.tasks.listeners import FULL, LOGGING, listeners

    # Out of the box only the framework's own receivers (which log id, path and status).
    assert listeners(task_started, GatorBackend) == LOGGING
    assert listeners(task_finished, GatorBackend) == LOGGING

    def listener(sender: Any, **kwargs: Any) -> None:
        return None

    task_started.connect(listener)
    try:
        assert listeners(task_started, GatorBackend) == FULL
    finally:
        task_started.disconnect(listener)


def test_the_frameworks_log_lines_name_each_task(caplog):
    with caplog.at_level(logging.INFO, logger=FRAMEWORK):
        result = tasks.add_numbers.enqueue(1, 2)
        run_worker()
    lines = [r.getMessage() for r in caplog.records if r.name == FRAMEWORK]
    path = "tests.testapp.tasks.add_numbers"
    assert any(f"id={result.id}" in line and path in line and "RUNNING" in line for line in lines)
    assert any(f"id={result.id}" in line and "SUCCESSFUL" in line for line in lines)


def test_the_backend_checks_its_options_and_queues():
    good = GatorBackend("default", {"QUEUES": ["default"], "OPTIONS": {"timeout": 5}})
    assert good.check() == []
    bad = GatorBackend(
        "x",
        {
            "QUEUES": ["ok", "not ok"],
            "OPTIONS": {"retry": 3, "timeout": -1, "retries": 2},
        },
    )
    messages = [e.msg for e in bad.check()]
    assert {e.id for e in bad.check()} == {"django_gator.E006"}
    assert any("unknown OPTIONS ['retries']" in m for m in messages)
    assert any("OPTIONS['retry'] must be a django_gator.Retry, got 3" in m for m in messages)
    assert any("OPTIONS['timeout']" in m and "-1" in m for m in messages)
    assert any("invalid queue name 'not ok'" in m for m in messages)


def test_every_job_state_has_a_task_status():
    from django_gator.tasks.results import STATUS

    assert set(STATUS) == set(JobState.values)
    assert {STATUS[s] for s in (JobState.DEAD, JobState.CANCELLED)} == {TaskResultStatus.FAILED}
    assert STATUS[JobState.FAILED] == TaskResultStatus.READY  # it will run again
