"""Signals, waits and sleeps in workflows (issue 34, items 2 and 3): a wait step released
by a signal from code or from ``gator_workflow signal``, its payload the result its
dependents read; a signal before the wait is kept; a second one changes nothing; a
timeout takes ``on_timeout`` or ends the wait dead; a sleep holds no thread and ends on
time. Workers here are burst workers of this process: each run ends when nothing is due,
which is how a test sees that a wait or a sleep is not due yet."""

from __future__ import annotations

import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_gator import Workflow
from django_gator.exceptions import WorkflowError
from django_gator.models import Job, JobState, WorkflowRun, WorkflowStep
from django_gator.states import StepState
from tests.conftest import run_worker
from tests.testapp.jobs import Escalates, Gathers, Produces

pytestmark = pytest.mark.django_db(transaction=True)


def _step(run: WorkflowRun, name: str) -> WorkflowStep:
    return WorkflowStep.objects.get(workflow=run, label=name)


def _job(run: WorkflowRun, name: str) -> Job:
    return Job.objects.get(pk=_step(run, name).job_id)


def _approval() -> WorkflowRun:
    wf = Workflow(name="order 42")
    wf.add(Produces, {"order": 42}, name="merge")
    wf.add_wait("approved", after=["merge"], timeout=timedelta(days=3), name="approval")
    wf.add(Gathers, "ship", after=["approval"], name="ship")
    return wf.dispatch()


def test_a_wait_step_is_released_by_a_signal_and_its_payload_reaches_its_dependents():
    run = _approval()
    run_worker("results")
    assert _step(run, "approval").state == StepState.RELEASED, "waiting for its signal"
    assert _step(run, "ship").state == StepState.BLOCKED
    wait = _job(run, "approval")
    assert wait.state == JobState.WAITING
    assert wait.next_execution_at > wait.created_at + timedelta(days=2), "due at its timeout"

    assert run.signal("approved", {"by": "ana"}, by="test") is True
    run_worker("results")

    assert _step(run, "approval").state == StepState.SUCCEEDED
    ship = _job(run, "ship")
    assert ship.state == JobState.SUCCEEDED
    assert ship.result == {"results": {"approval": {"by": "ana"}}, "extra": "ship"}
    run.refresh_from_db()
    assert run.signals["approved"]["by"] == "test"


def test_a_signal_sent_before_its_wait_is_reached_is_kept_and_a_second_changes_nothing():
    run = _approval()
    assert run.signal("approved", "early") is True
    assert run.signal("approved", "late") is False, "a duplicate is reported, not applied"

    run_worker("results")  # merge, then the wait (its signal is there), then ship

    assert _job(run, "ship").result == {"results": {"approval": "early"}, "extra": "ship"}


def test_a_signal_for_an_unknown_workflow_an_unknown_name_or_an_ended_wait_is_refused():
    run = _approval()
    with pytest.raises(
        WorkflowError, match=r"waits for no signal named 'aproved' \(its waits: 'approved'\)"
    ):
        run.signal("aproved")
    with pytest.raises(TypeError, match="payload"):
        run.signal("approved", {1, 2})
    ghost = WorkflowRun(name="ghost")
    with pytest.raises(WorkflowError, match=f"there is no workflow {ghost.pk}"):
        ghost.signal("approved")

    WorkflowStep.objects.filter(workflow=run, label="approval").update(state=StepState.CANCELLED)
    with pytest.raises(WorkflowError, match=r"its wait for 'approved' has ended \(cancelled\)"):
        run.signal("approved")


def test_gator_workflow_signal_delivers_once_and_names_what_is_wrong():
    run = _approval()
    out = StringIO()
    call_command(
        "gator_workflow", "signal", str(run.pk), "approved", "--payload", '{"ok": 1}', stdout=out
    )
    assert "delivered to workflow" in out.getvalue()
    out = StringIO()
    call_command("gator_workflow", "signal", str(run.pk), "approved", stdout=out)
    assert "already" in out.getvalue()
    with pytest.raises(CommandError, match="--payload must be JSON"):
        call_command("gator_workflow", "signal", str(run.pk), "approved", "--payload", "{oops")
    with pytest.raises(CommandError, match="must be a workflow's id"):
        call_command("gator_workflow", "signal", "42", "approved")
    with pytest.raises(CommandError, match="waits for no signal named 'nope'"):
        call_command("gator_workflow", "signal", str(run.pk), "nope")

    run_worker("results")
    assert _job(run, "ship").result == {"results": {"approval": {"ok": 1}}, "extra": "ship"}


def _timing_out(on_timeout: type | None) -> WorkflowRun:
    wf = Workflow(name="timeout")
    wf.add(Produces, 1, name="first")
    wf.add_wait("approved", after=["first"], timeout=0.3, on_timeout=on_timeout, name="approval")
    wf.add(Gathers, after=["approval"], name="next")
    run = wf.dispatch()
    run_worker("results")
    wait = _job(run, "approval")
    assert wait.state == JobState.WAITING
    while Job.objects.filter(pk=wait.pk, next_execution_at__gt=_db_now()).exists():
        time.sleep(0.05)
    run_worker("results")
    return run


def _db_now():
    from django.utils import timezone

    return timezone.now()


def test_a_wait_that_times_out_without_on_timeout_ends_dead_and_cancels_what_follows():
    run = _timing_out(None)
    wait = _job(run, "approval")
    assert wait.state == JobState.DEAD
    assert wait.errors[-1]["class"] == "django_gator.exceptions.WaitTimedOut"
    assert "the signal 'approved' did not come" in wait.errors[-1]["message"]
    assert _step(run, "next").state == StepState.CANCELLED


def test_a_wait_that_times_out_takes_its_on_timeout_path():
    run = _timing_out(Escalates)
    assert _job(run, "approval").result == {"escalated": "approved", "workflow": str(run.pk)}
    assert _job(run, "next").result == {
        "results": {"approval": {"escalated": "approved", "workflow": str(run.pk)}},
        "extra": None,
    }


def test_a_sleep_step_holds_no_thread_and_releases_what_follows_when_it_ends():
    wf = Workflow(name="cool off")
    wf.add(Produces, 1, name="first")
    wf.add_sleep(timedelta(seconds=0.4), after=["first"], name="cool_off")
    wf.add(Gathers, after=["cool_off"], name="last")
    run = wf.dispatch()

    run_worker("results")  # first; the sleep is not due: the burst worker ends
    first, sleep = _job(run, "first"), _job(run, "cool_off")
    assert first.state == JobState.SUCCEEDED
    assert sleep.state == JobState.WAITING
    assert sleep.queue == "results", "a sleep's job runs on the queue of the step before it"
    chained = Workflow(name="chained")
    chained.add(Produces, 1, name="a")
    chained.add_wait("ok", after=["a"], name="w")
    assert chained.add_sleep(1, after=["w"]).queue == "results", "after a wait: the wait's queue"
    assert _step(run, "last").state == StepState.BLOCKED
    while Job.objects.filter(pk=sleep.pk, next_execution_at__gt=_db_now()).exists():
        time.sleep(0.05)
    run_worker("results")

    last = _job(run, "last")
    assert last.state == JobState.SUCCEEDED
    assert last.started_at - first.finished_at >= timedelta(seconds=0.4)
    assert last.result == {"results": {"cool_off": None}, "extra": None}


def test_bad_sleeps_and_waits_are_refused_naming_the_value():
    wf = Workflow(name="bad")
    wf.add(Produces, 1, name="first")
    with pytest.raises(ValueError, match="a duration or at=, one of them"):
        wf.add_sleep(after=["first"])
    with pytest.raises(ValueError, match="duration must be a positive"):
        wf.add_sleep(-1, after=["first"])
    with pytest.raises(ValueError, match="timeout must be a positive"):
        wf.add_wait("ok", timeout=timedelta(0), after=["first"])
    with pytest.raises(ValueError, match="a signal's name is a non-empty str"):
        wf.add_wait("", after=["first"])
    wf.add_wait("ok", after=["first"])
    with pytest.raises(ValueError, match="waits for the signal 'ok' already"):
        wf.add_wait("ok", after=["first"])
    with pytest.raises(TypeError):
        wf.add_wait("other", on_timeout=Produces, after=["first"])  # takes (value), not 2 args


# -- the admin's Approve and Reject ------------------------------------------------------------


def _page(run: WorkflowRun) -> str:
    from django.urls import reverse

    return reverse("admin:django_gator_workflowrun_change", args=[run.pk])


def _decide(run: WorkflowRun) -> str:
    from django.urls import reverse

    return reverse("admin:django_gator_workflowrun_decide", args=[run.pk])


def test_approve_in_the_admin_needs_the_permission_a_csrf_token_and_a_post():
    import re

    from django.contrib.auth.models import User
    from django.test import Client

    from tests.admin_helpers import operator

    run = _approval()
    run_worker("results")
    viewer = operator("view_workflowrun", name="viewer")
    page = viewer.get(_page(run)).content.decode()
    assert "gator-workflow-waits" in page, "the waits are shown"
    assert "approve:approved" not in page, "no permission, no buttons"
    form = {"decision": "approve:approved", "note": "fine"}
    assert viewer.post(_decide(run), form).status_code == 403

    decider = operator("view_workflowrun", "signal_workflow", name="ana")
    assert decider.get(_decide(run)).status_code == 405, "a GET changes nothing"
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="ana"))
    assert strict.post(_decide(run), form).status_code == 403, "no CSRF token"
    page = strict.get(_page(run)).content.decode()
    assert 'value="approve:approved"' in page
    assert 'value="reject:approved"' in page
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    response = strict.post(_decide(run), {**form, "csrfmiddlewaretoken": token}, follow=True)
    assert "Approved &#x27;approved&#x27;" in response.content.decode()

    run.refresh_from_db()
    assert run.signals["approved"]["by"] == "ana"
    run_worker("results")
    assert _job(run, "ship").result == {
        "results": {"approval": {"approved": True, "by": "ana", "note": "fine"}},
        "extra": "ship",
    }
    page = decider.get(_page(run)).content.decode()
    assert "received at" in page
    assert "by ana" in page


def test_reject_in_the_admin_ends_the_wait_dead_and_cancels_what_follows():
    from tests.admin_helpers import operator

    run = _approval()
    run_worker("results")
    decider = operator("view_workflowrun", "signal_workflow", name="bob")
    response = decider.post(
        _decide(run), {"decision": "reject:approved", "note": "too costly"}, follow=True
    )
    assert "Rejected &#x27;approved&#x27;" in response.content.decode()
    run_worker("results")

    wait = _job(run, "approval")
    assert wait.state == JobState.DEAD
    assert wait.errors[-1]["class"] == "django_gator.exceptions.WaitRejected"
    assert "rejected by bob" in wait.errors[-1]["message"]
    assert "too costly" in wait.errors[-1]["message"]
    assert _step(run, "ship").state == StepState.CANCELLED
    again = decider.post(_decide(run), {"decision": "approve:approved"}, follow=True)
    assert "had come already" in again.content.decode()


# -- operating a workflow: retry from the failed step, cancel ----------------------------------


def test_retry_runs_a_workflow_again_from_its_failed_step_keeping_what_succeeded():
    run = _timing_out(None)  # the wait timed out: dead, "next" cancelled
    first = _job(run, "first")
    out = StringIO()
    call_command("gator_workflow", "retry", str(run.pk), stdout=out)
    assert "1 failed step job(s) due again" in out.getvalue()
    wait = _job(run, "approval")
    assert wait.state == JobState.WAITING
    assert wait.next_execution_at > _db_now(), "a retried wait waits again for its timeout"
    assert run.signal("approved", "second time") is True
    run_worker("results")

    assert _job(run, "next").result == {"results": {"approval": "second time"}, "extra": None}
    assert Job.objects.get(pk=first.pk).finished_at == first.finished_at, "not run again"


def test_cancel_ends_every_step_not_started_and_nothing_after_it_is_released():
    run = _approval()
    run_worker("results")  # merge done; the wait waits
    out = StringIO()
    call_command("gator_workflow", "cancel", str(run.pk), stdout=out)
    assert "cancelled" in out.getvalue()

    assert _job(run, "approval").state == JobState.CANCELLED
    ship = _step(run, "ship")
    assert ship.state == StepState.CANCELLED
    with pytest.raises(WorkflowError, match="has ended"):
        run.signal("approved")
    assert _job(run, "merge").state == JobState.SUCCEEDED


def test_the_admins_retry_and_cancel_need_their_permissions():
    from tests.admin_helpers import operator

    run = _timing_out(None)
    viewer = operator("view_workflowrun", name="viewer")
    page = viewer.get(_page(run)).content.decode()
    assert 'value="retry:"' not in page
    assert viewer.post(_decide(run), {"decision": "retry:"}).status_code == 403

    retrier = operator("view_workflowrun", "retry_job", "cancel_job", name="carol")
    page = retrier.get(_page(run)).content.decode()
    assert 'value="retry:"' in page
    assert 'value="cancel:"' in page
    response = retrier.post(_decide(run), {"decision": "retry:"}, follow=True)
    assert "1 failed step job(s) of this workflow due again" in response.content.decode()
    assert _job(run, "approval").audit[-1]["by"] == "carol"
    response = retrier.post(_decide(run), {"decision": "cancel:"}, follow=True)
    assert "Workflow cancelled" in response.content.decode()
    cancelled = _job(run, "approval")
    assert cancelled.state == JobState.CANCELLED
    assert (cancelled.audit[-1]["action"], cancelled.audit[-1]["by"]) == ("cancel", "carol")


@override_settings(GATOR_POLL_INTERVAL=20)
def test_a_signal_wakes_an_idle_worker_rather_than_waiting_for_its_poll():
    from django.db import connection

    from django_gator import wakeup
    from django_gator.worker.queues import parse_queue_specs
    from django_gator.worker.supervisor import WorkerProcess
    from tests.conftest import start_worker_thread, wait_for

    run = _approval()
    run_worker("results")  # merge; the wait is released and waits
    worker = WorkerProcess(
        parse_queue_specs(["results"]), concurrency=2, install_signal_handlers=False
    )
    thread = start_worker_thread(worker)
    try:
        wait_for(lambda: worker.slots.idle.is_set(), 30)
        # This process's list of workers to wake (SQLite, MariaDB) is read in the
        # background, a first dispatch finding it empty: read it now, as a long-running
        # web process has.
        wakeup.forget()
        wakeup.refresh(connection.alias)
        sent = time.monotonic()
        assert run.signal("approved", "now") is True
        wait_for(lambda: _job(run, "approval").state == JobState.SUCCEEDED, 30)
        took = time.monotonic() - sent
    finally:
        worker.request_stop()
        thread.join(30)
        wakeup.forget()
    assert took < 10, f"{took:.1f} s: found by the idle worker's next poll (20 s), not woken"
