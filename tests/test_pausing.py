"""Pausing and resuming queues: the functions, the claim of every engine, real worker
processes, the gator_queue command, gator_status and the dashboard's buttons."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.urls import reverse

import django_gator
from django_gator import stats
from django_gator.engines import get_engine
from django_gator.engines.core import Position
from django_gator.models import Job, JobState, Queue
from tests.admin_helpers import operator
from tests.conftest import (
    ROOT,
    learn_wakeup_targets,
    listening_backends,
    stop_worker,
    wait_for,
    worker_env,
    worker_output,
)
from tests.testapp.jobs import Noop, Record, Sleep
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

DASHBOARD = "admin:django_gator_job_dashboard"
PAUSE = "admin:django_gator_job_pause_queue"


def run(*args: str, **options: Any) -> str:
    out = StringIO()
    call_command("gator_queue", *args, stdout=out, **options)
    return out.getvalue()


# -- the functions ------------------------------------------------------------------------
def test_pause_and_resume_record_who_and_when_and_are_idempotent():
    assert django_gator.pause_queue("emails", by="alice") is True
    first = Queue.objects.get(name="emails")
    assert (first.paused, first.paused_by) == (True, "alice")
    assert first.paused_at is not None

    # A second pause changes nothing: the first one's who and when stay.
    assert django_gator.pause_queue("emails", by="bob") is False
    again = Queue.objects.get(name="emails")
    assert (again.paused_by, again.paused_at) == ("alice", first.paused_at)

    assert django_gator.resume_queue("emails", by="carol") is True
    resumed = Queue.objects.get(name="emails")
    assert (resumed.paused, resumed.paused_by, resumed.paused_at) == (False, "", None)
    assert resumed.updated_by == "carol"
    assert resumed.updated_at >= first.paused_at
    assert django_gator.resume_queue("emails") is False
    assert django_gator.resume_queue("never-paused") is False
    assert not Queue.objects.filter(name="never-paused").exists()


def test_a_long_who_is_cut_to_fit_its_column():
    django_gator.pause_queue("emails", by="ops-" + "x" * 300)
    row = Queue.objects.get(name="emails")
    assert row.paused_by == ("ops-" + "x" * 300)[:150]
    assert row.updated_by == row.paused_by


@pytest.mark.parametrize("name", ["", "no spaces", "x" * 101, "émails"])
def test_a_bad_queue_name_is_refused_naming_it(name):
    with pytest.raises(ValueError, match="invalid queue name") as caught:
        django_gator.pause_queue(name)
    assert repr(name)[:20] in str(caught.value)
    with pytest.raises(ValueError, match="invalid queue name"):
        django_gator.resume_queue(name)
    assert not Queue.objects.exists()


def test_a_paused_queue_is_claimed_by_no_engine_statement():
    engine = get_engine("default")
    waiting = [Noop.dispatch(queue="emails") for _ in range(3)]
    other = Noop.dispatch(queue="reports")
    django_gator.pause_queue("emails")

    assert engine.claim("w1", "emails", 10) == []
    if engine.supports_keyset:
        position = Position({0: (waiting[0].next_execution_at - timedelta(seconds=5), 0)}, 1.0)
        assert engine.claim("w1", "emails", 10, after=position) == []
    assert engine.claim_and_mark("w1", "emails", 10, []) == ([], [])
    # The all-queues mode does not even look at it.
    assert engine.ready_queues() == ["reports"]
    assert engine.ready_queues(["zzz"]) == ["reports"]
    assert [j.id for j in engine.claim("w1", "reports", 10)] == [other.pk]
    assert set(Job.objects.filter(queue="emails").values_list("state", flat=True)) == {
        JobState.WAITING
    }
    # Job.objects.ready() means "a worker may claim it now".
    assert not Job.objects.ready().filter(queue="emails").exists()

    django_gator.resume_queue("emails")
    assert sorted(j.id for j in engine.claim("w1", "emails", 10)) == [j.pk for j in waiting]


def test_stats_show_paused_queues_and_do_not_call_them_unserved():
    from tests.factories import WorkerFactory

    Noop.dispatch(queue="emails")
    django_gator.pause_queue("emails", by="ops")
    django_gator.pause_queue("idle")  # no jobs: known by its row
    WorkerFactory(queues=[["reports", 1]])
    queues = {q.queue: q for q in stats.queue_stats()}
    assert set(queues) == {"emails", "idle"}
    assert (queues["emails"].paused, queues["emails"].paused_by) == (True, "ops")
    assert queues["emails"].as_dict()["paused_at"] is not None
    assert stats.unserved_queues(list(queues.values()), stats.workers()) == []
    django_gator.resume_queue("emails")
    queues = {q.queue: q for q in stats.queue_stats()}
    assert (queues["emails"].paused, queues["emails"].as_dict()["paused_at"]) == (False, None)
    assert stats.unserved_queues(list(queues.values()), stats.workers()) == ["emails"]


def test_run_jobs_leaves_the_jobs_of_a_paused_queue_waiting():
    from django_gator.testing import run_jobs

    held = Record.dispatch("held", queue="emails")
    free = Record.dispatch("free", queue="reports")
    django_gator.pause_queue("emails")
    assert [j.pk for j in run_jobs()] == [free.pk]
    assert held.refresh_state() == JobState.WAITING
    django_gator.resume_queue("emails")
    assert [j.pk for j in run_jobs()] == [held.pk]


# -- real workers -------------------------------------------------------------------------
def started_after(queue: str, moment: Any) -> list[int]:
    return list(Job.objects.filter(queue=queue, started_at__gt=moment).values_list("pk", flat=True))


def test_workers_stop_claiming_a_paused_queue_and_resume_it(spawn_worker):
    engine = get_engine("default")
    emails = [Sleep.dispatch(0.4, label="email", queue="emails") for _ in range(36)]
    # Two workers serve every queue (the all-queues mode), one its two queues.
    workers = [
        spawn_worker("--concurrency", "4"),
        spawn_worker("--concurrency", "4"),
        spawn_worker("--concurrency", "4", "-q", "emails,2", "-q", "reports"),
    ]
    wait_for(lambda: Job.objects.filter(queue="emails", state=JobState.SUCCEEDED).count() >= 4)
    django_gator.pause_queue("emails", by="test")
    paused_at = engine.db_now()
    running_at_pause = set(
        Job.objects.filter(queue="emails", state=JobState.RUNNING).values_list("pk", flat=True)
    )

    # Meanwhile: other queues flow, new jobs of the paused queue wait.
    reports = [Record.dispatch("report", queue="reports") for _ in range(10)]
    later = [Sleep.dispatch(0.01, label="late", queue="emails") for _ in range(5)]
    wait_for(
        lambda: Job.objects.filter(queue="reports", state=JobState.SUCCEEDED).count() == 10,
        timeout=30,
    )
    quiet = 2.5 - (engine.db_now() - paused_at).total_seconds()
    time.sleep(max(0.0, quiet))  # deliberate: 2.5 s after the pause, for a wrong claim to show
    # Claims stopped within a second of the pause; what was running finished.
    assert started_after("emails", paused_at + timedelta(seconds=1)) == []
    assert not Job.objects.filter(queue="emails", state=JobState.RUNNING).exists()
    assert set(Job.objects.filter(pk__in=running_at_pause).values_list("state", flat=True)) <= {
        JobState.SUCCEEDED
    }
    waiting = Job.objects.filter(queue="emails", state=JobState.WAITING)
    assert waiting.count() >= 5
    assert set(waiting.values_list("attempts", flat=True)) == {0}
    assert not Job.objects.filter(queue="emails", state=JobState.WAITING, pk__in=running_at_pause)

    django_gator.resume_queue("emails", by="test")
    resumed_at = engine.db_now()
    wait_for(
        lambda: not Job.objects.filter(queue="emails").exclude(state=JobState.SUCCEEDED).exists(),
        timeout=60,
    )
    first_start = min(
        Job.objects.filter(
            queue="emails", started_at__gt=resumed_at - timedelta(seconds=0.2)
        ).values_list("started_at", flat=True)
    )
    assert first_start - resumed_at < timedelta(seconds=1.5)
    every = [*emails, *reports, *later]
    assert {j.refresh_state() for j in every} == {JobState.SUCCEEDED}
    # Each job ran once, in its first attempt.
    assert sorted(Execution.objects.values_list("job_id", "attempt")) == sorted(
        (j.pk, 1) for j in every
    )
    for proc in workers:
        stop_worker(proc)


def test_resume_wakes_idle_workers_at_once(spawn_worker):
    django_gator.pause_queue("emails")
    job = Record.dispatch("woken", queue="emails")  # before the worker: no wakeup reaches it
    # A poll interval of a minute: only the wakeup the resume sends (PostgreSQL's NOTIFY,
    # elsewhere a datagram) can wake the worker.
    env = {"GATOR_POLL_INTERVAL": "60", "GATOR_LOG_LEVEL": "DEBUG"}
    proc = spawn_worker("--concurrency", "2", env=env)
    # Listening, and its claim found nothing it may run: it waits for a NOTIFY (or 60 s);
    # with GATOR_NOTIFY = False, a datagram to the address in its row.
    if get_engine(connection.alias).notifies:
        wait_for(lambda: listening_backends() == 1, timeout=30)
    else:
        learn_wakeup_targets(proc)  # dispatch learns the worker's address now
    wait_for(lambda: "Worker idle" in worker_output(proc), timeout=30)
    assert job.refresh_state() == JobState.WAITING, worker_output(proc)
    started = time.monotonic()
    django_gator.resume_queue("emails")
    wait_for(lambda: job.refresh_state() == JobState.SUCCEEDED, timeout=5)
    assert time.monotonic() - started < 2.0
    stop_worker(proc)


# -- gator_queue and gator_status ---------------------------------------------------------
def test_gator_queue_pauses_resumes_and_lists():
    Noop.dispatch(queue="emails")
    Noop.dispatch(queue="reports")
    assert run("pause", "emails") == "queue emails paused\n"
    assert "already paused" in run("pause", "emails")
    row = Queue.objects.get(name="emails")
    assert row.paused
    assert row.paused_by.startswith("manage.py gator_queue (")

    listed = run("list")
    lines = {line.split()[0]: line for line in listed.splitlines()[1:]}
    assert set(lines) == {"emails", "reports"}
    assert "paused" in lines["emails"].split()
    assert "manage.py" in lines["emails"]
    assert "active" in lines["reports"].split()

    document = json.loads(run("list", "--json"))
    by_name = {q["queue"]: q for q in document}
    assert by_name["emails"]["paused"] is True
    assert by_name["emails"]["ready"] == 1
    assert by_name["emails"]["paused_at"]
    assert by_name["reports"]["paused_at"] is None
    assert by_name["reports"]["paused"] is False

    assert json.loads(run("resume", "emails", "--json")) == {
        "changed": True,
        "paused": False,
        "queue": "emails",
    }
    assert "was not paused" in run("resume", "emails")
    assert not Queue.objects.get(name="emails").paused


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("pause", "no spaces"), "NAME: invalid queue name 'no spaces'"),
        (("resume", "a/b"), "NAME: invalid queue name 'a/b'"),
        (("pause",), "pause needs a queue name"),
        (("list", "emails"), "list takes no queue name, got 'emails'"),
    ],
)
def test_gator_queue_refuses_bad_input_with_exit_code_2(args, message):
    with pytest.raises(CommandError) as caught:
        run(*args)
    assert caught.value.returncode == 2
    assert message in str(caught.value)
    assert not Queue.objects.exists()


def test_gator_queue_on_the_command_line_exits_2_on_a_bad_name():
    done = subprocess.run(
        [sys.executable, "-m", "django", "gator_queue", "pause", "bad name"],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "invalid queue name 'bad name'" in done.stderr


def test_gator_status_shows_paused_queues():
    Noop.dispatch(queue="emails")
    Noop.dispatch(queue="reports")
    django_gator.pause_queue("emails", by="ops")
    out = StringIO()
    call_command("gator_status", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[1].split()[-2:] == ["paused", "limit"]  # no limits: the last column is blank
    assert (
        next(line for line in lines if line.strip().startswith("emails")).rstrip().endswith("yes")
    )
    reports = next(line for line in lines if line.strip().startswith("reports"))
    assert not reports.rstrip().endswith("yes")

    out = StringIO()
    call_command("gator_status", "--json", stdout=out)
    queues = {q["queue"]: q for q in json.loads(out.getvalue())["queues"]}
    assert (queues["emails"]["paused"], queues["emails"]["paused_by"]) == (True, "ops")
    assert queues["reports"]["paused"] is False


# -- the dashboard's buttons --------------------------------------------------------------
def test_the_dashboard_shows_paused_queues_and_buttons_for_those_allowed():
    Noop.dispatch(queue="emails")
    Noop.dispatch(queue="reports")
    django_gator.pause_queue("emails", by="ops")
    page = operator().get(reverse(DASHBOARD)).content.decode()
    assert '<tr class="gator-paused">' in page
    assert "paused</strong>" in page
    assert "by ops" in page
    assert 'value="resume"' not in page
    assert 'id="gator-pause-any"' not in page

    allowed = operator("pause_queue", name="op2").get(reverse(DASHBOARD)).content.decode()
    assert 'name="action" value="resume"' in allowed
    assert 'name="action" value="pause"' in allowed  # reports, and the by-name form
    assert 'name="csrfmiddlewaretoken"' in allowed


def test_the_buttons_need_the_permission_and_a_csrf_token_and_record_the_user():
    Noop.dispatch(queue="emails")
    url = reverse(PAUSE)
    form = {"queue": "emails", "action": "pause"}
    assert operator().post(url, form).status_code == 403
    assert not Queue.objects.exists()

    client = operator("pause_queue", name="op2")
    assert client.get(url, form).status_code == 405  # GET changes nothing
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="op2"))
    assert strict.post(url, form).status_code == 403
    assert not Queue.objects.exists()

    response = client.post(url, form, follow=True)
    assert response.redirect_chain[-1][0] == reverse(DASHBOARD)
    assert "Queue emails paused" in response.content.decode()
    row = Queue.objects.get(name="emails")
    assert (row.paused, row.paused_by) == (True, "op2")
    assert row.paused_at is not None

    again = client.post(url, form, follow=True).content.decode()
    assert "already paused" in again
    resumed = client.post(url, {"queue": "emails", "action": "resume"}, follow=True)
    assert "Queue emails resumed" in resumed.content.decode()
    assert not Queue.objects.get(name="emails").paused


def test_the_buttons_refuse_a_bad_queue_name_with_a_message():
    client = operator("pause_queue")
    page = client.post(
        reverse(PAUSE), {"queue": "no spaces", "action": "pause"}, follow=True
    ).content.decode()
    assert "Nothing changed: invalid queue name &#x27;no spaces&#x27;" in page
    page = client.post(
        reverse(PAUSE), {"queue": "emails", "action": "explode"}, follow=True
    ).content.decode()
    assert "Unknown queue action &#x27;explode&#x27;" in page
    assert not Queue.objects.exists()
