"""Captured logs (issue 35): the log records an attempt emits are kept with it, per
attempt, bounded, redacted, attributed to the right job among many threads, and shown in
the admin."""

from __future__ import annotations

import logging

import pytest
from django.test import override_settings
from django.urls import reverse

from django_gator.joblogs import level_of
from django_gator.models import Job, JobState
from tests.conftest import run_worker
from tests.testapp.log_jobs import (
    AtomicLogs,
    LogsAsync,
    LogsBySetting,
    LogsConcurrently,
    LogsMany,
    LogsThenHangs,
    LogsTwoAttempts,
    NeverLogs,
)

pytestmark = pytest.mark.django_db(transaction=True)


class Seen(logging.Handler):
    """What the project's own handlers receive (on the root logger)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def root_handler():
    handler = Seen()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)


def messages(entry: dict) -> list[str]:
    return [line.split(": ", 1)[1].splitlines()[0] for line in entry["lines"]]


def test_two_attempts_keep_their_own_lines_with_the_libraries_and_the_secret_masked(
    root_handler,
):
    job = LogsTwoAttempts.dispatch(3, password="hunter22")
    run_worker("logs", concurrency=2)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED, job.last_error
    first, second = job.logs()
    assert (first["attempt"], second["attempt"]) == (1, 2)
    assert first["level"] == "INFO"
    assert first["dropped"] == 0
    assert messages(first) == [
        "attempt 1 starts with 3 items",
        "library saw attempt-1",
        "the password is [redacted]",
        "caught and logged",
    ]
    assert messages(second) == [
        "attempt 2 starts with 3 items",
        "library saw attempt-2",
        "the password is [redacted]",
    ]
    # The traceback of logger.exception() is in its line.
    assert "ValueError: first attempt fails" in first["lines"][3]
    assert first["lines"][0].split(" ")[1:3] == ["INFO", "tests.jobs:"]
    # Masked before it was stored, not only when shown.
    assert "hunter22" not in str(job.captured_logs)
    # The root logger's level (WARNING) was not lowered for the project's handlers: they
    # saw the warnings and the error, not the INFO lines captured for the job alone.
    seen = {r.getMessage() for r in root_handler.records if r.name.startswith("tests.")}
    assert seen == {"the password is hunter22", "caught and logged"}


def test_the_admin_shows_each_attempts_lines_apart(admin_client):
    job = LogsTwoAttempts.dispatch(2, password="hunter22")
    run_worker("logs", concurrency=1)
    page = admin_client.get(reverse("admin:django_gator_job_change", args=[job.pk]))
    html = page.content.decode()
    assert page.status_code == 200
    assert html.count('<details class="gator-logs"') == 2
    assert "Attempt 1" in html
    assert "Attempt 2" in html
    assert "attempt 1 starts with 2 items" in html
    assert "library saw attempt-2" in html
    assert "hunter22" not in html
    listing = admin_client.get(reverse("admin:django_gator_job_changelist"))
    assert listing.status_code == 200


@override_settings(GATOR_JOB_LOG_LINES=50, GATOR_JOB_LOG_BYTES=100_000)
def test_the_newest_lines_are_kept_within_the_line_bound_and_the_rest_counted():
    job = LogsMany.dispatch(1000)
    run_worker("logs", concurrency=1)
    (entry,) = Job.objects.get(pk=job.pk).logs()
    assert entry["dropped"] == 950
    assert [m.split(" ")[1] for m in messages(entry)] == [f"{i:05d}" for i in range(950, 1000)]


@override_settings(GATOR_JOB_LOG_LINES=10_000, GATOR_JOB_LOG_BYTES=4096)
def test_the_newest_lines_are_kept_within_the_byte_bound_and_a_huge_line_is_cut():
    job = LogsMany.dispatch(200, size=100)
    huge = LogsMany.dispatch(1, size=20_000)
    run_worker("logs", concurrency=1)
    (entry,) = Job.objects.get(pk=job.pk).logs()
    size = sum(len(line.encode()) for line in entry["lines"])
    assert size <= 4096
    assert entry["dropped"] + len(entry["lines"]) == 200
    assert 4096 - size < 200  # as many as fit
    assert messages(entry)[-1].startswith("line 00199 ")
    (cut,) = Job.objects.get(pk=huge.pk).logs()
    assert len(cut["lines"][0].encode()) <= 4096
    assert cut["lines"][0].endswith("[cut]")
    assert cut["dropped"] == 0


def test_sixteen_threads_running_different_jobs_keep_their_own_lines():
    LogsConcurrently.arrived = 0
    LogsConcurrently.all_here.clear()
    jobs = [LogsConcurrently.dispatch(f"job{n:02d}", 40, 16) for n in range(16)]
    run_worker("logs", concurrency=16)
    for job in jobs:
        job.refresh_from_db()
        assert job.state == JobState.SUCCEEDED, job.last_error
        (entry,) = job.logs()
        tag = job.args[0]
        assert len(entry["lines"]) == 80
        # Every line is this job's own: its tag, from its logger or the library's.
        assert all(tag in line for line in entry["lines"]), (tag, entry["lines"][:5])
        assert messages(entry)[::2] == [f"{tag} line {i}" for i in range(40)]


def test_an_async_jobs_task_subtasks_and_sync_calls_are_captured_per_attempt():
    one = LogsAsync.dispatch("one")
    two = LogsAsync.dispatch("two")
    run_worker("logs", concurrency=1)
    for job, tag in ((one, "one"), (two, "two")):
        job.refresh_from_db()
        assert job.state == JobState.SUCCEEDED, job.last_error
        first, second = job.logs()
        for entry, attempt in ((first, 1), (second, 2)):
            assert entry["attempt"] == attempt
            assert sorted(messages(entry)) == sorted(
                [
                    f"{tag} async starts, attempt {attempt}",
                    f"{tag} subtask 1",
                    f"{tag} subtask 2",
                    f"library saw {tag}-sync",
                ]
            )


def test_the_setting_chooses_for_classes_without_a_level_and_false_opts_out():
    quiet = LogsBySetting.dispatch()
    run_worker("logs", concurrency=1)
    assert Job.objects.get(pk=quiet.pk).logs() == []  # capture is off by default
    with override_settings(GATOR_JOB_LOG_LEVEL="WARNING"):
        job = LogsBySetting.dispatch()
        never = NeverLogs.dispatch()
        run_worker("logs", concurrency=1)
    (entry,) = Job.objects.get(pk=job.pk).logs()
    assert entry["level"] == "WARNING"
    assert messages(entry) == ["a warning line"]
    assert Job.objects.get(pk=never.pk).captured_logs is None


def test_a_timed_out_attempt_and_an_atomic_jobs_failed_attempt_keep_their_lines():
    hung = LogsThenHangs.dispatch()
    atomic = AtomicLogs.dispatch()
    run_worker("logs", concurrency=2)
    hung.refresh_from_db()
    assert hung.state == JobState.DEAD
    assert hung.error_class.endswith("JobTimeout")
    (entry,) = hung.logs()
    assert messages(entry) == ["before the hang"]
    atomic.refresh_from_db()
    assert atomic.state == JobState.SUCCEEDED, atomic.last_error
    assert [messages(e) for e in atomic.logs()] == [["atomic attempt 1"], ["atomic attempt 2"]]


@pytest.mark.parametrize(
    ("value", "level"), [("info", logging.INFO), ("DEBUG", logging.DEBUG), (25, 25), (None, None)]
)
def test_log_levels_by_name_or_number(value, level):
    assert level_of(value) == level


@pytest.mark.parametrize("value", ["LOUD", -1, True, 1.5])
def test_a_bad_log_level_is_refused_when_the_class_is_defined(value):
    from django_gator import Queueable

    with pytest.raises(ValueError, match="log_level") as info:

        class BadLevel(Queueable, abstract=True):
            log_level = value

            def handle(self) -> None: ...

    assert repr(value) in str(info.value)
