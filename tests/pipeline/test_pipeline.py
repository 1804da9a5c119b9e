"""The insertion pipeline (django_gator/pipeline/): every way of inserting jobs (dispatch,
dispatch_many, a batch's members, a chain, a workflow) goes through the same steps, so none
of them can skip the wakeup, the span, the deferred retries or the signal."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_gator import Chain, Workflow, wakeup
from django_gator.models import Batch, Job, Worker
from tests.conftest import learn_wakeup_targets, stop_worker, wait_for, worker_output
from tests.testapp.jobs import Echo

#: A worker's poll interval in the latency test: only a wakeup can start a job within
#: seconds of its dispatch.
LONG_POLL = 120
#: Longest start, in seconds, that still counts as woken (a poll would take LONG_POLL).
WOKEN = 10.0


def _started_within(job: Job, timeout: float) -> float:
    """Seconds from now until ``job`` is claimed (its row gets ``locked_at``)."""
    begin = time.monotonic()
    wait_for(
        lambda: Job.objects.filter(pk=job.pk, locked_at__isnull=False).exists(),
        timeout=timeout,
        interval=0.01,
    )
    return time.monotonic() - begin


def _first_of_workflow(label: str) -> Job:
    workflow = Workflow(f"latency {label}")
    first = workflow.add(Echo, label)
    workflow.add(Echo, f"{label} after", after=[first])
    workflow.dispatch()
    assert first.job is not None
    return first.job


def _batch_member(label: str) -> Job:
    # Left open: on MariaDB the close right after would race the woken claim (the close's
    # MySQLEngine._member_in locks the member FOR UPDATE NOWAIT, and a claim that runs
    # meanwhile passes it by with SKIP LOCKED: the member then waits for the poll).
    with Batch().joined():
        return Echo.dispatch(label)


def _not_woken(kind: str, job: Job, proc: Any, latencies: dict[str, list[float]]) -> str:
    """Why ``job`` did not start: was its worker a wakeup target, alive, and does a wakeup
    sent now start it (then the dispatch's own wakeup was missing)?"""
    worker = Worker.objects.filter(pid=proc.pid).values("heartbeat_at").first()
    row = Job.objects.filter(pk=job.pk).values("state", "queue", "batch_id").first()
    sent = wakeup.send(connection.alias, {job.queue})
    try:
        again: float | None = _started_within(job, 5)
    except AssertionError:
        again = None
    return (
        f"{kind}: not started within {WOKEN} s of its dispatch (the worker polls every "
        f"{LONG_POLL} s, so no wakeup reached it); so far: {latencies}; wakeup targets "
        f"{wakeup._directory(connection.alias).targets}; worker {worker} at "
        f"{timezone.now()}; job {row}; a wakeup sent now ({sent} datagrams) started it "
        f"after {again} s\n{worker_output(proc)}"
    )


@pytest.mark.skipif(
    connection.vendor == "postgresql",
    reason="PostgreSQL wakes workers with NOTIFY inside the INSERT's transaction",
)
@pytest.mark.django_db(transaction=True)
def test_an_idle_worker_starts_workflows_and_chains_as_fast_as_a_plain_dispatch(spawn_worker):
    wakeup.forget()
    proc = spawn_worker("--concurrency", "2", "--poll-interval", str(LONG_POLL))
    try:
        wait_for(lambda: Worker.objects.filter(pid=proc.pid).exists(), timeout=60)
        assert Worker.objects.get(pid=proc.pid).wakeup_address
        learn_wakeup_targets(proc)  # this process now knows the worker's address
        kinds: dict[str, Callable[[str], Job]] = {
            "plain": lambda label: Echo.dispatch(label),
            "many": lambda label: Echo.dispatch_many([[label], [label]])[0],
            "batch": _batch_member,
            "chain": lambda label: Chain(Echo, Echo).dispatch(label),
            "workflow": _first_of_workflow,
        }
        latencies: dict[str, list[float]] = {kind: [] for kind in kinds}
        for round_ in range(3):
            for kind, dispatch in kinds.items():
                # The worker is idle: whatever it was given has ended, and its fetcher
                # waits LONG_POLL seconds for its next claim unless a wakeup comes.
                wait_for(lambda: not Job.objects.exclude(state="succeeded").exists(), 30)
                job = dispatch(f"{kind}-{round_}")
                try:
                    latencies[kind].append(_started_within(job, WOKEN))
                except AssertionError:
                    raise AssertionError(_not_woken(kind, job, proc, latencies)) from None
        medians = {kind: statistics.median(values) for kind, values in latencies.items()}
        # Woken, not polled: each kind starts within the plain dispatch's latency, give or
        # take the noise of a shared machine (a poll would be LONG_POLL seconds).
        assert max(medians.values()) < medians["plain"] + 2.0, medians
        wait_for(lambda: not Job.objects.exclude(state="succeeded").exists(), 30)
    finally:
        stop_worker(proc)


@pytest.mark.skipif(
    connection.vendor == "postgresql",
    reason="PostgreSQL wakes workers with NOTIFY inside the outcome's transaction",
)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["chain", "workflow"])
def test_jobs_an_outcome_inserts_wake_the_workers_of_their_queue(spawn_worker, kind):
    """A chain's next step and a workflow's released step are inserted by the worker that
    ran the step before, in its outcome's transaction; another worker serving their queue
    is woken (it polls every LONG_POLL s): they once waited for its poll on SQLite and
    MariaDB."""
    from tests.testapp.jobs import Noop

    wakeup.forget()
    first = spawn_worker("--concurrency", "2", "-q", "default", "--poll-interval", str(LONG_POLL))
    second = spawn_worker("--concurrency", "2", "-q", "echo", "--poll-interval", str(LONG_POLL))
    try:
        learn_wakeup_targets(first, second, timeout=60)
        # The second worker runs a job, then is idle: its next claim found nothing and it
        # waits LONG_POLL seconds unless a wakeup comes.
        probe = Echo.dispatch("probe")
        try:
            _started_within(probe, WOKEN)
        except AssertionError:
            raise AssertionError(_not_woken("probe", probe, second, {})) from None
        wait_for(lambda: Job.objects.filter(pk=probe.pk, state="succeeded").exists(), 30)
        if kind == "chain":
            Chain(Noop, Echo).dispatch()
        else:
            workflow = Workflow("woken by an outcome")
            workflow.add(Echo, "after", after=[workflow.add(Noop)])
            workflow.dispatch()
        wait_for(lambda: Job.objects.filter(queue="default", state="succeeded").exists(), 30)
        ended = time.monotonic()
        wait_for(lambda: Job.objects.filter(queue="echo").exclude(pk=probe.pk).exists(), 10)
        [step] = Job.objects.filter(queue="echo").exclude(pk=probe.pk)
        try:
            _started_within(step, WOKEN)
        except AssertionError:
            raise AssertionError(_not_woken(kind, step, second, {})) from None
        assert time.monotonic() - ended < WOKEN
    finally:
        stop_worker(first)
        stop_worker(second)
