"""Crash safety under fire: worker processes SIGKILLed at random while they drain jobs.

The fast tier runs in ``make test``; ``GATOR_CHAOS_JOBS`` and ``GATOR_CHAOS_KILLS`` scale it
up (``make test-chaos``)."""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter

import pytest
from django.db.models import Count

from django_gator.models import Job, JobState, Worker
from tests.conftest import wait_for
from tests.testapp.jobs import Record
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = int(os.environ.get("GATOR_CHAOS_JOBS", "600"))
KILLS = int(os.environ.get("GATOR_CHAOS_KILLS", "4"))
WORKERS = 3


def test_random_sigkills_lose_nothing_and_rerun_only_jobs_in_flight(spawn_worker):
    rng = random.Random(int(os.environ.get("GATOR_CHAOS_SEED", "20261122")))
    jobs = Record.dispatch_many(
        [{"label": f"c{i}", "sleep": rng.choice((0, 0, 0.002, 0.01))} for i in range(JOBS)]
    )
    procs = [spawn_worker("--concurrency", "4") for _ in range(WORKERS)]

    kills = 0
    started = time.monotonic()
    while kills < KILLS and Job.objects.exclude(state=JobState.SUCCEEDED).exists():
        time.sleep(rng.uniform(0.2, 0.8))
        victim = rng.randrange(len(procs))
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait(timeout=10)
        procs[victim] = spawn_worker("--concurrency", "4")
        kills += 1

    wait_for(
        lambda: not Job.objects.exclude(state=JobState.SUCCEEDED).exists(),
        timeout=60 + JOBS / 50,
    )
    elapsed = time.monotonic() - started
    # A worker started after the last kill may still be booting: SIGTERM before its handlers
    # are installed would kill it outright. Its worker row appears once they are.
    wait_for(
        lambda: {p.pid for p in procs} <= set(Worker.objects.values_list("pid", flat=True)),
        timeout=30,
    )
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=30) == 0

    ids = [j.pk for j in jobs]
    states = Counter(Job.objects.filter(pk__in=ids).values_list("state", flat=True))
    assert states == {JobState.SUCCEEDED: JOBS}, states
    runs = dict(
        Execution.objects.values("job_id").annotate(n=Count("id")).values_list("job_id", "n")
    )
    assert set(runs) == set(ids), "every job ran"
    rows = Job.objects.filter(pk__in=ids).values_list("pk", "attempts", "rescues")
    for pk, attempts, rescues in rows:
        # A second run only happens to a job whose worker died under it, and each run is
        # one claim (the ledger's unique (job, attempt) key would reject a doubled claim).
        assert runs[pk] <= attempts, (pk, runs[pk], attempts)
        assert attempts == 1 + rescues, (pk, attempts, rescues)
    rerun = sum(1 for n in runs.values() if n > 1)
    print(
        f"\nchaos: jobs={JOBS} kills={kills} rescued={sum(r for _, _, r in rows)} "
        f"rerun={rerun} lost=0 elapsed={elapsed:.1f}s"
    )
    assert kills >= 1, "no worker was killed: the jobs drained too fast to test anything"
