"""Jobs that never end (issue 29, item 3): hand-backs by stopping workers are counted on
the row, every GATOR_MAX_HANDBACKS-th one charges the attempt it cut, GATOR_DEFAULT_TIMEOUT
bounds classes that set no timeout, and long runners show in the metrics, in
``gator_status --check --max-running`` and in the admin."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from django_gator.models import Job, JobState
from tests.conftest import run_worker, stop_worker, wait_for, worker_output
from tests.factories import JobFactory, WorkerFactory
from tests.test_health import check, status
from tests.testapp.jobs import (
    AsyncSleep,
    BlocksForever,
    BlocksForeverWithRetry,
    LoopsForever,
    LoopsWithOwnTimeout,
)

pytestmark = pytest.mark.django_db(transaction=True)

HANDED_BACK = "django_gator.exceptions.JobHandedBack"


def runs(started_file: Path) -> list[tuple[int, int]]:
    """(pid, attempt) of every run of a BlocksForever job so far."""
    if not started_file.exists():
        return []
    return [
        (int(pid), int(attempt))
        for pid, attempt in (line.split() for line in started_file.read_text().splitlines())
    ]


def run_and_stop(spawn_worker, started_file: Path, bound: int) -> str:
    """Start a real worker, wait until the job has started in it (one more run in the
    file), then SIGTERM it: its shutdown timeout (0.3 s) runs out with the job still
    running, and the worker hands it back. Returns the worker's log."""
    before = len(runs(started_file))
    proc = spawn_worker(
        "--concurrency",
        "1",
        "--shutdown-timeout",
        "0.3",
        env={"GATOR_MAX_HANDBACKS": str(bound)},
    )
    wait_for(lambda: len(runs(started_file)) == before + 1, timeout=60)
    stop_worker(proc)
    return worker_output(proc)


def oldest_running_age(client: Client, queue: str) -> float | None:
    """``gator_queue_oldest_running_age_seconds{queue}`` as the metrics view serves it."""
    response = client.get("/gator-metrics/")
    assert response.status_code == 200
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            if (
                sample.name == "gator_queue_oldest_running_age_seconds"
                and sample.labels.get("queue") == queue
            ):
                return float(sample.value)
    return None


@override_settings(GATOR_METRICS_CACHE_SECONDS=0)
def test_a_job_that_blocks_forever_is_charged_at_the_bound_and_ends_dead(spawn_worker, tmp_path):
    started = tmp_path / "started"
    job = BlocksForever.dispatch(str(started))

    # Two hand-backs: counted, the attempt given back each time, as before.
    for handed_back in (1, 2):
        log = run_and_stop(spawn_worker, started, bound=3)
        job.refresh_from_db()
        assert (job.state, job.attempts, job.handbacks) == (
            JobState.WAITING,
            0,
            handed_back,
        ), log
        assert not job.errors
        assert "Worker exiting with jobs still running id=" in log

    # The third run: while it blocks, it shows as a long runner.
    proc = spawn_worker(
        "--concurrency", "1", "--shutdown-timeout", "0.3", env={"GATOR_MAX_HANDBACKS": "3"}
    )
    wait_for(lambda: len(runs(started)) == 3, timeout=60)
    client = Client()
    wait_for(lambda: (oldest_running_age(client, BlocksForever.queue) or 0) > 1.0, timeout=30)
    code, said = check("--max-running", "1")
    assert code == 1, said
    worker_id = Job.objects.get(pk=job.pk).reserved_by
    assert re.search(
        rf"job {job.pk} \({re.escape(BlocksForever.name)}\) has run for [\d.]+ s on worker "
        rf"{re.escape(worker_id)}, more than --max-running 1 \(handed back 2 times before\)",
        said,
    ), said
    assert check("--max-running", "3600")[0] == 0
    # The command line itself: exit 1, the job named on stderr.
    failed = status("--check", "--max-running", "1")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert f"job {job.pk} ({BlocksForever.name}) has run for " in failed.stderr
    stop_worker(proc)

    # The third hand-back charges the attempt: no retry policy, so dead.
    job.refresh_from_db()
    assert (job.state, job.attempts, job.handbacks) == (JobState.DEAD, 1, 3)
    assert job.finished_at is not None
    [entry] = job.errors
    assert entry["class"] == HANDED_BACK
    assert "stopped 3 times while this job ran" in entry["message"]
    assert entry["attempt"] == 1
    assert job.error_class == HANDED_BACK
    assert "result=dead" in worker_output(proc)
    # Three runs, each in its own worker process, each the first attempt.
    assert [attempt for _, attempt in runs(started)] == [1, 1, 1]
    assert len({pid for pid, _ in runs(started)}) == 3
    # Nothing runs now: the metric is back to 0 and the check passes.
    assert oldest_running_age(client, BlocksForever.queue) == 0
    assert check("--max-running", "1")[0] == 1  # no live worker is still a problem
    WorkerFactory()
    assert check("--max-running", "1") == (0, "healthy: 1 live worker\n")


def test_a_charged_hand_back_goes_to_the_retry_policy_whose_retry_gets_the_same_allowance(
    spawn_worker, tmp_path
):
    started = tmp_path / "started"
    job = BlocksForeverWithRetry.dispatch(str(started))

    run_and_stop(spawn_worker, started, bound=2)
    job.refresh_from_db()
    assert (job.state, job.attempts, job.handbacks) == (JobState.WAITING, 0, 1)

    run_and_stop(spawn_worker, started, bound=2)
    job.refresh_from_db()
    # Charged: failed, its retry due in 300 s as its policy says, the error in its history.
    assert (job.state, job.attempts, job.handbacks) == (JobState.FAILED, 1, 2)
    assert job.errors[-1]["class"] == HANDED_BACK
    assert job.next_execution_at > timezone.now() + timedelta(seconds=200)

    # The retry runs as attempt 2; one hand-back of it is not charged (the second would be).
    Job.objects.filter(pk=job.pk).update(next_execution_at=timezone.now())
    run_and_stop(spawn_worker, started, bound=2)
    job.refresh_from_db()
    assert (job.state, job.attempts, job.handbacks) == (JobState.WAITING, 1, 3)
    assert [attempt for _, attempt in runs(started)] == [1, 1, 2]
    assert len(job.errors) == 1


# -- the default timeout ---------------------------------------------------------------------
@override_settings(GATOR_DEFAULT_TIMEOUT=0.5)
def test_the_default_timeout_bounds_a_class_without_its_own_and_not_one_with():
    endless = LoopsForever.dispatch(30, queue="deft")
    own = LoopsWithOwnTimeout.dispatch(1.5, queue="deft")  # its own 10 s wins over 0.5 s
    run_worker("deft")

    endless.refresh_from_db()
    assert endless.state == JobState.DEAD
    assert endless.error_class == "django_gator.exceptions.JobTimeout"
    assert "longer than its timeout of 0.5 s" in endless.last_error
    own.refresh_from_db()
    assert own.state == JobState.SUCCEEDED
    assert own.result == "finished"


@override_settings(GATOR_DEFAULT_TIMEOUT=0.5)
def test_the_default_timeout_cancels_an_async_job_without_its_own():
    job = AsyncSleep.dispatch(30)
    run_worker("aio")
    job.refresh_from_db()
    assert job.state == JobState.DEAD
    assert "longer than its timeout of 0.5 s" in job.last_error


def test_without_the_default_timeout_a_class_without_its_own_is_not_bounded():
    job = LoopsForever.dispatch(0.7, queue="deft")
    run_worker("deft")
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED


# -- long runners: metrics, gator_status, admin ---------------------------------------------
def long_runner(hours: float = 2, **fields: object) -> Job:
    worker = WorkerFactory()
    return JobFactory(
        running=True,
        queue="long",
        reserved_by=worker.id,
        locked_at=timezone.now() - timedelta(hours=hours),
        **fields,
    )


@override_settings(GATOR_METRICS_CACHE_SECONDS=0)
def test_the_oldest_running_jobs_age_is_a_gauge_per_queue():
    client = Client()
    long_runner(hours=2)
    JobFactory(running=True, queue="long")  # a second, younger one: the oldest counts
    JobFactory(queue="idle")
    assert 7200 <= (oldest_running_age(client, "long") or 0) < 7200 + 60
    assert oldest_running_age(client, "idle") == 0


def test_max_running_names_each_long_runner_and_passes_without_one():
    job = long_runner(hours=2, handbacks=0)
    young = JobFactory(running=True, queue="long", reserved_by=job.reserved_by)

    code, said = check("--max-running", "60")
    assert code == 1
    assert f"job {job.pk} (tests.testapp.jobs.Noop) has run for 72" in said
    assert f"on worker {job.reserved_by}, more than --max-running 60" in said
    assert f"job {young.pk} " not in said
    assert "handed back" not in said
    assert check("--max-running", "10800") == (0, "healthy: 1 live worker\n")
    assert check()[0] == 0  # not asked for: not checked


def test_max_running_goes_with_check_and_refuses_a_bad_value():
    with pytest.raises(CommandError, match="go with --check") as raised:
        call_command("gator_status", "--max-running", "60")
    assert raised.value.returncode == 2
    with pytest.raises(CommandError, match="--max-running") as raised:
        call_command("gator_status", "--check", "--max-running", "-1")


def test_the_admin_flags_a_job_running_longer_than_the_threshold(admin_client: Client):
    old = long_runner(hours=2, handbacks=2)
    young = JobFactory(running=True, queue="long")

    dashboard = admin_client.get(reverse("admin:django_gator_job_dashboard")).content.decode()
    note = re.search(r'<div class="errornote gator-long-running-note".*?</div>', dashboard, re.S)
    assert note, dashboard
    assert f"#{old.pk}</a>" in note.group(0)
    assert f"#{young.pk}</a>" not in note.group(0)
    assert "handed back 2 times before" in note.group(0)
    assert re.search(r'class="gator-long-running"[^>]*>72\d\d\.\d s</strong>', dashboard)

    listing = admin_client.get(reverse("admin:django_gator_job_changelist")).content.decode()
    cells = dict(
        re.findall(
            r'<a href="[^"]*/(\d+)/change/[^>]*>.*?<td class="field-next_run">(.*?)</td>',
            listing,
            re.S,
        )
    )
    assert "running for 2h00m" in cells[str(old.pk)]
    assert "handed back by stopping workers 2 times" in cells[str(old.pk)]
    assert "gator-long-running" not in cells[str(young.pk)]

    page = admin_client.get(reverse("admin:django_gator_job_change", args=[old.pk]))
    assert re.search(r"Handbacks.*?<div class=\"readonly\">2</div>", page.content.decode(), re.S)

    with override_settings(GATOR_LONG_RUNNING_AFTER=10800):
        calm = admin_client.get(reverse("admin:django_gator_job_dashboard")).content.decode()
    assert "gator-long-running-note" not in calm
