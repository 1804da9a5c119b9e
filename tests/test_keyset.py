"""Keyset claims (PostgreSQL): while a worker drains a backlog, each claim starts after the
last job it claimed instead of stepping over the dead index entries of the rows before it;
a full claim at least every KEYSET_FULL_EVERY seconds keeps priorities honest."""

from __future__ import annotations

import signal
import time

import pytest
from django.db import connection

from django_gator.engines import get_engine
from django_gator.models import Job, JobState
from tests.conftest import wait_for, worker_output
from tests.testapp.jobs import Noop, Record

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        "connection.vendor != 'postgresql'", reason="keyset claims are PostgreSQL's"
    ),
]


def test_a_keyset_claim_starts_after_the_last_claimed_job():
    engine = get_engine("default")
    jobs = Noop.dispatch_many([[i] for i in range(5)])
    first = engine.claim("w", "default", 2)
    assert [j.id for j in first] == [jobs[0].pk, jobs[1].pk]
    last = first[-1]
    urgent = Noop.dispatch("urgent", priority=50)

    after = engine.claim("w", "default", 2, after=(last.priority, last.next_execution_at, last.id))
    assert [j.id for j in after] == [jobs[2].pk, jobs[3].pk]  # not the urgent job
    full = engine.claim("w", "default", 2)
    assert [j.id for j in full] == [urgent.pk, jobs[4].pk]  # a full claim sees it first


def test_a_higher_priority_job_overtakes_a_backlog_being_drained(spawn_worker):
    assert connection.vendor == "postgresql"
    backlog = Record.dispatch_many([{"label": f"b{i}", "sleep": 0.005} for i in range(600)])
    worker = spawn_worker("--concurrency", "2")
    wait_for(lambda: Job.objects.filter(state=JobState.SUCCEEDED).count() >= 50)
    urgent = Record.dispatch(label="urgent", priority=50)
    dispatched = time.monotonic()
    wait_for(lambda: Job.objects.get(pk=urgent.pk).state == JobState.SUCCEEDED, timeout=30)
    waited = time.monotonic() - dispatched
    left = Job.objects.filter(pk__in=[j.pk for j in backlog]).exclude(state=JobState.SUCCEEDED)
    assert left.count() > 100, f"the urgent job waited {waited:.2f} s, behind the backlog"
    wait_for(lambda: not left.exists(), timeout=60)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker_output(worker)
