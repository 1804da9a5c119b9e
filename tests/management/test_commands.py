"""The operator commands: ``gator_status``, ``gator_prune`` and ``gator_retry``, and the
figures of :mod:`django_gator.stats` behind the first."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django.utils import timezone

from django_gator import stats
from django_gator.models import Job, JobState
from tests.conftest import ROOT, worker_env
from tests.factories import JobFactory, WorkerFactory

pytestmark = pytest.mark.django_db(transaction=True)

DAY = 24 * 3600


def run(command: str, *args: str, **options: Any) -> str:
    out = StringIO()
    call_command(command, *args, stdout=out, **options)
    return out.getvalue()


def refused(command: str, *args: str) -> str:
    """Run a command that must refuse its arguments with exit code 2; returns the message."""
    with pytest.raises(CommandError) as caught:
        run(command, *args)
    assert caught.value.returncode == 2, caught.value
    return str(caught.value)


def ago(**delta: float) -> Any:
    return timezone.now() - timedelta(**delta)


def later(**delta: float) -> Any:
    return timezone.now() + timedelta(**delta)


def dead_job(error_class: str = "RuntimeError", **fields: Any) -> Job:
    """A dead job whose last attempt raised ``error_class``, recorded as the worker does."""
    job = JobFactory(dead=True, attempts=2, **fields)
    job.errors[-1]["class"] = error_class
    job.last_error = f"{error_class}: attempt 2 failed"
    job.error_class = error_class
    job.save(update_fields=["errors", "last_error", "error_class"])
    return job


def states() -> dict[int, str]:
    return dict(Job.objects.values_list("id", "state"))


# -- gator_status -------------------------------------------------------------------------


def populate() -> dict[str, Job]:
    """Jobs in every state on two queues; the oldest ready job is 2 minutes late. With the
    workers' tallies of their ends (django_gator.tallies), which the last-hour counts read:
    two successes and a death in the last hour."""
    from django_gator.models import FinishedTally

    FinishedTally.objects.create(minute=ago(seconds=0), queue="default", succeeded=1)
    FinishedTally.objects.create(minute=ago(minutes=59), queue="default", succeeded=1, dead=1)
    FinishedTally.objects.create(minute=ago(hours=2), queue="default", succeeded=1, dead=1)
    FinishedTally.objects.create(minute=ago(days=2), queue="emails", succeeded=1)
    return {
        "late": JobFactory(next_execution_at=ago(minutes=2)),
        "due": JobFactory(),
        "later": JobFactory(scheduled=True),
        "retry_later": JobFactory(failed=True),  # retry due in a minute: scheduled
        "retry_due": JobFactory(failed=True, next_execution_at=ago(seconds=5)),
        "running": JobFactory(running=True),
        "dead_now": JobFactory(dead=True),
        "dead_old": JobFactory(dead=True, finished_at=ago(hours=2)),
        "done_1": JobFactory(succeeded=True),
        "done_2": JobFactory(succeeded=True, finished_at=ago(minutes=59)),
        "done_old": JobFactory(succeeded=True, finished_at=ago(hours=2)),
        "cancelled": JobFactory(cancelled=True),
        "emails": JobFactory(queue="emails", scheduled=True),
        "emails_done": JobFactory(queue="emails", succeeded=True, finished_at=ago(days=2)),
    }


def test_queue_stats_separate_ready_from_scheduled_and_count_the_last_hour():
    populate()

    default, emails = stats.queue_stats()

    assert default.queue == "default"
    assert default.ready == 3  # late, due, retry_due
    assert default.scheduled == 2  # later, retry_later
    assert default.failed == 2
    assert default.running == 1
    assert default.dead == 2
    assert 100 < default.oldest_due_age < 600
    assert default.oldest_due_at is not None
    assert default.succeeded_last_hour == 2
    assert default.dead_last_hour == 1
    assert default.succeeded is None  # not counted unless exact=True
    assert default.cancelled is None
    assert (emails.queue, emails.ready, emails.scheduled) == ("emails", 0, 1)
    assert emails.oldest_due_age is None
    assert emails.succeeded_last_hour == 0


def test_queue_stats_exact_counts_every_finished_job():
    populate()

    default, emails = stats.queue_stats(exact=True)

    assert (default.succeeded, default.cancelled) == (3, 1)
    assert (emails.succeeded, emails.cancelled) == (1, 0)


def test_a_queue_with_only_old_finished_jobs_is_left_out():
    JobFactory(queue="quiet", succeeded=True, finished_at=ago(days=1))
    JobFactory(queue="quiet", cancelled=True)

    assert stats.queue_stats() == []
    assert [q.queue for q in stats.queue_stats(exact=True)] == ["quiet"]


def test_workers_lists_live_ones_with_their_running_jobs():
    live = WorkerFactory(queues=[["default", 1], ["emails", 3]], concurrency=4)
    idle = WorkerFactory()
    stale = WorkerFactory(stale=True)
    first = JobFactory(running=True, reserved_by=live.id)
    second = JobFactory(running=True, reserved_by=live.id)
    JobFactory(running=True, reserved_by=stale.id)
    JobFactory(succeeded=True, reserved_by=live.id)

    found = {w.id: w for w in stats.workers()}

    assert set(found) == {live.id, idle.id}
    assert found[live.id].running_job_ids == sorted([first.pk, second.pk])
    assert found[live.id].running == 2
    assert found[live.id].concurrency == 4
    assert found[live.id].queues == [["default", 1], ["emails", 3]]
    assert 0 <= found[live.id].heartbeat_age < 60
    assert found[idle.id].running_job_ids == []


def test_estimated_total_counts_the_jobs_table():
    JobFactory.create_batch(3)

    count, exact = stats.estimated_total()

    assert isinstance(count, int)
    assert isinstance(exact, bool)
    assert count >= 0
    if exact:
        assert count == 3


def test_status_prints_queues_workers_and_table_size():
    populate()
    worker = WorkerFactory(queues=[["default", 1], ["emails", 3]])
    JobFactory(running=True, reserved_by=worker.id)

    out = run("gator_status")

    lines = out.splitlines()
    header = next(line for line in lines if "scheduled" in line)
    for column in ("queue", "ready", "running", "failed(retrying)", "dead", "oldest due age"):
        assert column in header
    assert "done/h" in header
    assert "dead/h" in header
    default = next(line for line in lines if line.split()[:1] == ["default"]).split()
    # queue ready scheduled running failed dead age done/h dead/h
    assert default[:6] == ["default", "3", "2", "2", "2", "2"]
    assert default[6].endswith("s")
    assert default[7:9] == ["2", "1"]
    # The limit column: the limits of the job classes whose queue it is.
    assert "SecretLimited 1 at once per key" in " ".join(default[9:])
    assert any(line.split()[:1] == ["(all)"] for line in lines)
    assert "Workers (1 live)" in out
    assert worker.id in out
    assert "default emails,3" in out
    assert "Jobs table:" in out


def test_status_with_nothing_to_show():
    out = run("gator_status")

    assert "no waiting, running, failed or dead jobs" in out
    assert "Workers (0 live)" in out
    count, noun = table_size(out)
    assert noun == ("row" if count == 1 else "rows")
    if stats.estimated_total("default")[1]:
        assert count == 0


def table_size(out: str) -> tuple[int, str]:
    """The count and noun of gator_status's "Jobs table: ..." line (an estimate on
    PostgreSQL and MariaDB, exact on SQLite)."""
    found = re.search(
        r"^Jobs table: (?:exactly|about \(database estimate\)) ([\d,]+) (\w+)\.", out, re.M
    )
    assert found, out
    return int(found[1].replace(",", "")), found[2]


def test_status_counts_one_row_in_the_singular():
    JobFactory(succeeded=True)

    count, noun = table_size(run("gator_status"))

    assert noun == ("row" if count == 1 else "rows")
    if stats.estimated_total("default")[1]:  # exact on SQLite: the job just made
        assert count == 1


def test_status_json_has_stable_keys():
    populate()
    worker = WorkerFactory()
    running = JobFactory(running=True, reserved_by=worker.id)

    document = json.loads(run("gator_status", "--json"))

    assert set(document) == {
        "now", "database", "vendor", "queues", "workers", "total_rows", "progress"
    }  # fmt: skip
    assert document["database"] == "default"
    assert set(document["total_rows"]) == {"count", "exact"}
    default = document["queues"][0]
    assert set(default) == {
        "queue",
        "ready",
        "scheduled",
        "running",
        "failed",
        "dead",
        "oldest_due_at",
        "oldest_due_age",
        "oldest_running_at",
        "oldest_running_age",
        "succeeded_last_hour",
        "dead_last_hour",
        "succeeded",
        "cancelled",
        "paused",
        "paused_at",
        "paused_by",
        "concurrency",
        "rate_limit",
        "limits_by",
        "job_limits",
    }
    assert default["queue"] == "default"
    assert (default["paused"], default["paused_at"], default["paused_by"]) == (False, None, "")
    assert (default["ready"], default["scheduled"], default["running"]) == (3, 2, 2)
    assert default["oldest_due_age"] > 100
    assert default["succeeded"] is None
    assert [q["queue"] for q in document["queues"]] == ["default", "emails"]
    (entry,) = document["workers"]
    assert set(entry) == {
        "id",
        "hostname",
        "pid",
        "queues",
        "concurrency",
        "started_at",
        "heartbeat_at",
        "heartbeat_age",
        "running",
        "running_job_ids",
        "supervisor",
        "stale",
    }
    assert entry["stale"] is False
    assert entry["running_job_ids"] == [running.pk]
    assert entry["running"] == 1

    exact = json.loads(run("gator_status", "--json", "--exact"))
    assert exact["queues"][0]["succeeded"] == 3


# -- gator_prune --------------------------------------------------------------------------


def old_and_new() -> dict[str, Job]:
    """Finished jobs on both sides of the default retentions, and unfinished jobs with a
    finished_at from long ago that must survive every prune."""
    return {
        "succeeded_old": JobFactory(succeeded=True, finished_at=ago(days=8)),
        "succeeded_new": JobFactory(succeeded=True, finished_at=ago(days=6)),
        "cancelled_old": JobFactory(cancelled=True, finished_at=ago(days=8)),
        "cancelled_new": JobFactory(cancelled=True, finished_at=ago(days=1)),
        "dead_old": JobFactory(dead=True, finished_at=ago(days=31)),
        "dead_new": JobFactory(dead=True, finished_at=ago(days=8)),
        "waiting": JobFactory(finished_at=ago(days=100)),
        "running": JobFactory(running=True, finished_at=ago(days=100)),
        "failed": JobFactory(failed=True, finished_at=ago(days=100)),
    }


def test_prune_deletes_old_succeeded_and_cancelled_jobs_only():
    jobs = old_and_new()

    out = run("gator_prune")

    left = states()
    assert jobs["succeeded_old"].pk not in left
    assert jobs["cancelled_old"].pk not in left
    gone = {jobs["succeeded_old"].pk, jobs["cancelled_old"].pk}
    assert set(left) == {job.pk for job in jobs.values()} - gone
    assert "deleted 2 jobs (1 succeeded, 1 cancelled)" in out


def test_prune_dead_with_its_own_retention():
    jobs = old_and_new()

    run("gator_prune", "--dead")

    left = states()
    assert jobs["dead_old"].pk not in left
    assert jobs["dead_new"].pk in left
    assert {jobs["waiting"].pk, jobs["running"].pk, jobs["failed"].pk} <= set(left)


def test_prune_in_batches_reports_progress():
    old = JobFactory.create_batch(5, succeeded=True, finished_at=ago(days=8))
    kept = JobFactory(succeeded=True)

    out = run("gator_prune", "--batch-size", "2")

    assert out.splitlines() == [
        "deleted 2 (total 2)",
        "deleted 2 (total 4)",
        "deleted 1 (total 5)",
        "deleted 5 jobs (5 succeeded, 0 cancelled)",
    ]
    assert set(states()) == {kept.pk}
    assert len(old) == 5


def test_prune_max_batches_stops_early():
    JobFactory.create_batch(5, succeeded=True, finished_at=ago(days=8))

    out = run("gator_prune", "--batch-size", "2", "--max-batches", "2")

    assert "deleted 2 (total 4)" in out
    assert "stopped after 2 batches" in out
    assert Job.objects.count() == 1


def test_prune_messages_use_the_singular_for_one():
    JobFactory.create_batch(2, succeeded=True, finished_at=ago(days=8))

    out = run("gator_prune", "--batch-size", "1", "--max-batches", "1")

    assert "deleted 1 job (1 succeeded, 0 cancelled)" in out
    assert "stopped after 1 batch (--max-batches)" in out


def test_prune_dry_run_deletes_nothing():
    jobs = old_and_new()

    out = run("gator_prune", "--dry-run", "--dead")

    assert set(states()) == {job.pk for job in jobs.values()}
    assert "would delete 1 succeeded job finished before" in out
    assert "would delete 1 cancelled job finished before" in out
    assert "would delete 1 dead job finished before" in out
    assert "would delete 3 jobs in all" in out


def test_prune_older_than_and_state_override_the_settings():
    jobs = old_and_new()

    run("gator_prune", "--older-than", "3600", "--state", "cancelled", "--state", "dead")

    left = states()
    for gone in ("cancelled_old", "cancelled_new", "dead_old", "dead_new"):
        assert jobs[gone].pk not in left
    for kept in ("succeeded_old", "succeeded_new", "waiting", "running", "failed"):
        assert jobs[kept].pk in left


def test_prune_older_than_zero_never_touches_unfinished_jobs():
    jobs = old_and_new()

    run("gator_prune", "--older-than", "0", "--dead")

    assert set(states()) == {jobs["waiting"].pk, jobs["running"].pk, jobs["failed"].pk}


@override_settings(GATOR_PRUNE_SUCCEEDED_AFTER=3600, GATOR_PRUNE_CANCELLED_AFTER=30 * DAY)
def test_prune_reads_the_retention_settings():
    jobs = old_and_new()

    run("gator_prune")

    left = states()
    assert jobs["succeeded_new"].pk not in left
    assert jobs["succeeded_old"].pk not in left
    assert jobs["cancelled_old"].pk in left


def test_prune_retention_longer_than_the_calendar_prunes_nothing():
    old_and_new()

    out = run("gator_prune", "--older-than", "1e300")

    assert "deleted 0 jobs" in out
    assert Job.objects.count() == 9


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
        (["--batch-size", "many"], "'many' is not a whole number"),
        (["--max-batches", "-3"], "--max-batches must be at least 1, got -3"),
        (["--older-than", "-1"], "got '-1'"),
        (["--older-than", "soon"], "'soon' is not a finite number of seconds"),
        (["--older-than", "inf"], "got 'inf'"),
        (["--state", "waiting"], "--state 'waiting' is not one of succeeded, cancelled, dead"),
    ],
)
def test_prune_bad_values_exit_2_naming_the_value(args, message):
    JobFactory(succeeded=True, finished_at=ago(days=30))

    assert message in refused("gator_prune", *args)
    assert Job.objects.count() == 1


@override_settings(GATOR_PRUNE_DEAD_AFTER=-1, GATOR_PRUNE_SUCCEEDED_AFTER="a week")
def test_prune_settings_are_checked():
    messages = [e.msg for e in checks.run_checks() if e.id == "django_gator.E003"]

    assert any("GATOR_PRUNE_DEAD_AFTER" in m for m in messages)
    assert any("GATOR_PRUNE_SUCCEEDED_AFTER" in m for m in messages)


# -- gator_retry --------------------------------------------------------------------------


def test_retry_by_name_keeps_attempts_and_history():
    boom = dead_job(name="tests.testapp.jobs.Boom")
    other = dead_job(name="tests.testapp.jobs.Noop")

    out = run("gator_retry", "--name", "tests.testapp.jobs.Boom")

    boom.refresh_from_db()
    assert boom.state == JobState.WAITING
    assert boom.finished_at is None
    assert boom.attempts == 2
    assert len(boom.errors) == 2
    assert other.refresh_state() == JobState.DEAD
    assert "retried 1 job, skipped 0" in out


def test_retry_by_error_class_matches_the_last_attempt():
    runtime = dead_job("RuntimeError")
    lost = dead_job("django_gator.exceptions.WorkerLost")
    similar = dead_job("myapp.RuntimeErrorish")
    earlier = dead_job("ValueError")
    earlier.errors[0]["class"] = "RuntimeError"  # an earlier attempt does not count
    earlier.save(update_fields=["errors"])

    run("gator_retry", "--error", "RuntimeError")

    assert runtime.refresh_state() == JobState.WAITING
    assert similar.refresh_state() == JobState.DEAD
    assert earlier.refresh_state() == JobState.DEAD
    assert lost.refresh_state() == JobState.DEAD

    run("gator_retry", "--error", "WorkerLost")  # the class's last dotted part is enough

    assert lost.refresh_state() == JobState.WAITING
    assert similar.refresh_state() == JobState.DEAD


def test_retry_by_error_matches_jobs_that_died_before_the_error_class_column():
    # Rows that failed before migration 0005 have no error_class; their last_error starts
    # with the class, as every failure has written it since the first version.
    old = dead_job("myapp.jobs.Boom")
    other = dead_job("myapp.jobs.Boomer")
    Job.objects.filter(pk__in=[old.pk, other.pk]).update(error_class=None)

    run("gator_retry", "--error", "Boom")

    assert old.refresh_state() == JobState.WAITING
    assert other.refresh_state() == JobState.DEAD


def test_retry_by_id_reports_ids_that_are_not_dead():
    dead = dead_job()
    waiting = JobFactory()
    failed = JobFactory(failed=True)

    out = run("gator_retry", "--id", str(dead.pk), "--id", str(waiting.pk), "--id", str(failed.pk))

    assert dead.refresh_state() == JobState.WAITING
    assert failed.refresh_state() == JobState.FAILED  # only with --failed
    assert f"not dead (or not matching the other options): {waiting.pk}, {failed.pk}" in out
    assert "retried 1 job," in out

    run("gator_retry", "--id", str(failed.pk), "--failed")

    failed.refresh_from_db()
    assert failed.state == JobState.WAITING
    assert failed.next_execution_at <= timezone.now() + timedelta(seconds=5)


def test_retry_selectors_must_all_match():
    match = dead_job("RuntimeError", name="tests.testapp.jobs.Boom")
    wrong_error = dead_job("ValueError", name="tests.testapp.jobs.Boom")
    wrong_name = dead_job("RuntimeError", name="tests.testapp.jobs.Noop")

    run("gator_retry", "--name", "tests.testapp.jobs.Boom", "--error", "RuntimeError")

    assert match.refresh_state() == JobState.WAITING
    assert wrong_error.refresh_state() == JobState.DEAD
    assert wrong_name.refresh_state() == JobState.DEAD


def test_retry_all_onto_another_queue():
    first = dead_job(queue="default")
    second = dead_job(queue="emails")
    failed = JobFactory(failed=True)

    out = run("gator_retry", "--all", "--queue", "retries")

    for job in (first, second):
        job.refresh_from_db()
        assert (job.state, job.queue) == (JobState.WAITING, "retries")
    failed.refresh_from_db()
    assert (failed.state, failed.queue) == (JobState.FAILED, "default")
    assert "retried 2 jobs onto queue 'retries', skipped 0" in out


def test_retry_skips_a_unique_job_whose_key_is_taken_and_leaves_it_on_its_queue():
    dead = dead_job(name="tests.testapp.jobs.UniqueReport", unique_key="k1")
    JobFactory(name="tests.testapp.jobs.UniqueReport", unique_key="k1")  # waiting, same key
    free = dead_job(name="tests.testapp.jobs.UniqueReport", unique_key="k2")

    out = run("gator_retry", "--all", "--queue", "retries")

    dead.refresh_from_db()
    assert (dead.state, dead.queue) == (JobState.DEAD, "default")
    free.refresh_from_db()
    assert (free.state, free.queue) == (JobState.WAITING, "retries")
    assert "retried 1 job onto queue 'retries', skipped 1" in out


def test_retry_dry_run_changes_nothing():
    job = dead_job()

    out = run("gator_retry", "--all", "--dry-run")

    assert job.refresh_state() == JobState.DEAD
    assert "would retry 1 dead job " in out


def test_retry_without_a_selector_retries_nothing():
    job = dead_job()

    message = refused("gator_retry")

    assert "--name, --error, --id or --all" in message
    assert job.refresh_state() == JobState.DEAD
    assert "--name, --error, --id or --all" in refused("gator_retry", "--queue", "x", "--failed")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--id", "abc"], "--id: 'abc' is not a whole number"),
        (["--id", "0"], "--id must be at least 1, got 0"),
        (["--all", "--queue", "bad queue"], "invalid queue name 'bad queue'"),
        (["--error", "Runtime Error"], "--error 'Runtime Error' is not an exception class"),
        (["--all", "--name", "x"], "do not combine it with --name, --error or --id"),
        (["--name", ""], "job name must be a non-empty str"),
    ],
)
def test_retry_bad_values_exit_2_naming_the_value(args, message):
    job = dead_job()

    assert message in refused("gator_retry", *args)
    assert job.refresh_state() == JobState.DEAD


def test_retry_accepts_call_command_keywords():
    job = dead_job()

    run("gator_retry", ids=[job.pk], queue="low")

    job.refresh_from_db()
    assert (job.state, job.queue) == (JobState.WAITING, "low")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["gator_prune", "--batch-size", "0"], "--batch-size must be at least 1, got 0"),
        (["gator_retry"], "choose the jobs to retry with --name, --error, --id or --all"),
    ],
)
def test_bad_command_line_exits_2(args, message):
    proc = subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr


def test_commands_exit_0_from_the_command_line():
    JobFactory(succeeded=True, finished_at=ago(days=30))
    dead_job()

    for args in (["gator_status", "--json"], ["gator_retry", "--all"], ["gator_prune"]):
        proc = subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=ROOT,
            env=worker_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, (args, proc.stderr)
    assert list(Job.objects.values_list("state", flat=True)) == [JobState.WAITING]


def test_status_shows_each_worker_process_under_its_supervisor():
    alone = WorkerFactory()
    sup = "host-a:4242:0badcafe"
    first = WorkerFactory(supervisor=sup)
    second = WorkerFactory(supervisor=sup)

    lines = run("gator_status").splitlines()
    document = json.loads(run("gator_status", "--json"))

    at = {name: i for i, line in enumerate(lines) for name in (line.split() or [""])[:2]}
    assert "Workers (3 live)" in lines
    assert at[alone.id] < at[sup] < at[first.id] < at[second.id]
    assert lines[at[sup]].split() == ["supervisor", sup]
    assert lines[at[first.id]].startswith(f"    {first.id}")  # indented under it
    by_id = {w["id"]: w["supervisor"] for w in document["workers"]}
    assert by_id == {alone.id: "", first.id: sup, second.id: sup}


def test_prune_deletes_the_batches_and_workflows_left_without_jobs():
    from django_gator import Batch, Workflow
    from django_gator.models import WorkflowRun
    from django_gator.testing import run_jobs
    from tests.testapp.jobs import Noop

    with Batch() as batch:
        Noop.dispatch()
    wf = Workflow(name="done")
    wf.add(Noop, after=[wf.add_batch(Noop, [[], []])])
    wf.dispatch()
    run_jobs()
    Job.objects.update(finished_at=ago(days=8))
    Batch.objects.update(completed_at=ago(days=8))
    WorkflowRun.objects.update(created_at=ago(days=8))

    dry = run("gator_prune", "--dry-run")
    assert "would delete 0 batches and 0 workflows none of whose jobs is left" in dry
    out = run("gator_prune")
    assert "deleted 4 jobs (4 succeeded, 0 cancelled)" in out
    assert "deleted 2 batches and 1 workflow none of whose jobs is left" in out
    assert not Batch.objects.exists()
    assert not WorkflowRun.objects.exists()
    assert batch.pk is not None
