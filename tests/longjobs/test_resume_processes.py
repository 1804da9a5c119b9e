"""Long-running jobs (issue 35) in real worker processes: progress seen while a job runs,
and a job resuming from its checkpoint after a SIGKILL (rescued), a SIGTERM (handed back
by each()) and a --max-jobs recycle. The ledger (ItemDone) shows each item's runs."""

from __future__ import annotations

import json
import signal
from collections import Counter

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from django_gator.models import Job, JobState
from tests.conftest import kill_session, stop_worker, wait_for, worker_output
from tests.testapp.long_jobs import CountsItems
from tests.testapp.models import ItemDone

pytestmark = pytest.mark.django_db(transaction=True)

#: Seconds between two checkpoint writes in these workers.
INTERVAL = 0.2


def _ledger(job: Job) -> list[tuple[int, int, int]]:
    """(item, attempt, pid) of every item the job processed, in order."""
    rows = ItemDone.objects.filter(job_id=job.pk).order_by("pk")
    return list(rows.values_list("item", "attempt", "pid"))


def _done(job: Job) -> int:
    return ItemDone.objects.filter(job_id=job.pk).count()


def test_progress_is_seen_in_gator_status_and_the_admin_while_a_job_runs(
    spawn_worker, admin_client: Client, capsys
):
    job = CountsItems.dispatch(400, pause=0.05)
    proc = spawn_worker("-q", "long", "--concurrency", "1", env={"GATOR_PROGRESS_INTERVAL": "0.2"})
    # A rate once the attempt has run for a second.
    wait_for(lambda: (Job.objects.get(pk=job.pk).progress or {}).get("rate"), timeout=60)

    call_command("gator_status")
    out = capsys.readouterr().out
    assert "Progress of running jobs" in out
    assert "/ 400 (" in out
    call_command("gator_status", "--json")
    [shown] = json.loads(capsys.readouterr().out)["progress"]
    assert shown["id"] == job.pk
    assert shown["progress"]["total"] == 400

    listing = admin_client.get(reverse("admin:django_gator_job_changelist")).content.decode()
    assert '<progress class="gator-progress" max="100"' in listing
    assert "/ 400 (" in listing
    page = admin_client.get(reverse("admin:django_gator_job_change", args=[job.pk]))
    text = page.content.decode()
    assert "per second" in text
    assert "left" in text
    assert "&quot;each&quot;" in text or '"each"' in text  # the checkpoint
    # Later figures replace earlier ones while it runs.
    first = Job.objects.get(pk=job.pk).progress["done"]
    wait_for(lambda: Job.objects.get(pk=job.pk).progress["done"] > first + 3, timeout=30)
    stop_worker(proc)


def test_a_job_sigkilled_midway_resumes_from_its_last_checkpoint(spawn_worker):
    job = CountsItems.dispatch(150, pause=0.02)
    env = {"GATOR_PROGRESS_INTERVAL": str(INTERVAL)}
    first = spawn_worker("-q", "long", "--concurrency", "1", env=env)
    wait_for(lambda: _done(job) >= 40, timeout=60)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    kill_session(first.pid)
    saved = Job.objects.get(pk=job.pk).checkpoint_data["each"]
    assert saved >= 20  # written along the way, not only at the end

    second = spawn_worker("-q", "long", "--concurrency", "1", env=env)
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED, timeout=90)
    stop_worker(second)

    ledger = _ledger(job)
    counts = Counter(item for item, _, _ in ledger)
    assert sorted(counts) == list(range(150))  # nothing missed
    resumed = [item for item, attempt, _ in ledger if attempt == 2]
    assert resumed[0] == saved  # the rescued job started at its checkpoint
    twice = sorted(item for item, n in counts.items() if n > 1)
    # Only the items after the last write (at most INTERVAL s of work, a few items at
    # 20 ms each, plus scheduling slack) ran twice, and each at most twice.
    assert max(counts.values()) <= 2
    assert len(twice) <= 25, twice
    assert twice == list(range(saved, saved + len(twice)))


def test_a_job_handed_back_by_sigterm_resumes_at_the_next_item(spawn_worker):
    job = CountsItems.dispatch(300, pause=0.02)
    # A long shutdown timeout: only each()'s hand-back lets the worker stop at once.
    first = spawn_worker("-q", "long", "--concurrency", "1", "--shutdown-timeout", "120")
    wait_for(lambda: _done(job) >= 30, timeout=60)
    stop_worker(first, timeout=20)
    row = Job.objects.get(pk=job.pk)
    assert row.state == JobState.WAITING
    assert row.handbacks == 1
    assert row.attempts == 0  # given back, not charged
    assert not row.errors
    stopped_at = row.checkpoint_data["each"]
    assert stopped_at == _done(job)  # written at the hand-back: exactly where it stopped

    second = spawn_worker("-q", "long", "--concurrency", "1")
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED, timeout=90)
    stop_worker(second)
    items = [item for item, _, _ in _ledger(job)]
    assert items == list(range(300))  # each item once, in order


def test_a_job_resumes_in_the_next_process_after_a_max_jobs_recycle(spawn_worker):
    # An hour between writes: only the write at the end of the failed attempt saves its
    # position, before the worker process recycles.
    job = CountsItems.dispatch(60, pause=0.01, fail_at=30)
    env = {"GATOR_PROGRESS_INTERVAL": "3600", "GATOR_LOG_LEVEL": "INFO"}
    first = spawn_worker("-q", "long", "--concurrency", "1", "--max-jobs", "1", env=env)
    assert first.wait(timeout=60) == 0, worker_output(first)  # recycled: exits by itself
    assert "reason=max-jobs 1" in worker_output(first)
    assert Job.objects.get(pk=job.pk).checkpoint_data == {"each": 30}
    second = spawn_worker("-q", "long", "--concurrency", "1", "--max-jobs", "1", env=env)
    assert second.wait(timeout=60) == 0, worker_output(second)
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED
    ledger = _ledger(job)
    assert [item for item, _, _ in ledger] == list(range(60))  # none twice, none missed
    pids = {attempt: pid for _, attempt, pid in ledger}
    assert pids == {1: first.pid, 2: second.pid}
