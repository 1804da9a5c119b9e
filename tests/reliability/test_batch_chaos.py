"""Issue 18's bar for batches: a batch drained by 3 worker processes that are SIGKILLed at
random and restarted dispatches ``on_complete`` and ``on_success`` exactly once each, after
its last member ended (a ledger counts their runs; the callbacks are atomic jobs, so their
ledger rows commit with their success marks). The same for a workflow's batch step: the
step after it is released once, after its last member.

The unit tier runs GATOR_BATCH_CHAOS_JOBS members (default 1,000) with a few kills; the
chaos tier (``make test-chaos``) runs 10,000 with 6 kills on each database.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db.models import Max

from django_gator import Batch, Workflow
from django_gator.models import Job, JobState, Worker, WorkflowStep
from django_gator.states import StepState
from tests.chaos import _retry_db
from tests.conftest import ROOT, worker_env
from tests.testapp.jobs import AtomicBatchCompleted, AtomicBatchSucceeded, RecordWithRetry
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = int(os.environ.get("GATOR_BATCH_CHAOS_JOBS", "1000"))
KILLS = int(os.environ.get("GATOR_BATCH_CHAOS_KILLS", "3"))
WORKERS = 3


def _spawn(env: dict[str, str], log_dir: Path, n: int) -> subprocess.Popen[bytes]:
    with (log_dir / f"worker-{n}.log").open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "django", "gator_worker", "--concurrency", "4"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _drain_with_kills(rng: random.Random, log_dir: Path, done: Callable[[], bool]) -> int:
    """Three worker processes (each restarted after a SIGKILL, KILLS of them at random
    moments) until ``done()`` and every job succeeded; then stopped. Returns the kills
    made."""

    def drained() -> bool:
        return done() and not Job.objects.exclude(state=JobState.SUCCEEDED).exists()

    env = worker_env(GATOR_HEARTBEAT_TIMEOUT="3", GATOR_MAX_RESCUES="10")
    procs = [_spawn(env, log_dir, n) for n in range(WORKERS)]
    spawned = WORKERS
    kills = 0
    started = time.monotonic()
    try:
        while not _retry_db(drained):
            assert time.monotonic() - started < 120 + JOBS / 20, f"no drain; logs {log_dir}"
            time.sleep(rng.uniform(0.5, 1.5))
            if kills < KILLS:
                registered = set(
                    _retry_db(lambda: list(Worker.objects.values_list("pid", flat=True)))
                )
                alive = [p for p in procs if p.poll() is None and p.pid in registered]
                if alive:
                    victim = rng.choice(alive)
                    victim.send_signal(signal.SIGKILL)
                    victim.wait()
                    kills += 1
                    procs[procs.index(victim)] = _spawn(env, log_dir, spawned)
                    spawned += 1
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert kills == KILLS, "the drain ended before every kill was made"
    return kills


def _members(rng: random.Random, prefix: str) -> list[dict[str, object]]:
    # Sleeps long enough that the drain outlasts the planned kills (about 1.5 s apart).
    mean = 1.5 * (KILLS + 1) * WORKERS * 4 / JOBS
    return [
        {"label": f"{prefix}{i}", "sleep": round(rng.uniform(0, 2 * mean), 4)} for i in range(JOBS)
    ]


@pytest.mark.timeout(1200)
def test_a_batch_under_sigkills_dispatches_each_callback_exactly_once(tmp_path: Path):
    rng = random.Random(int(os.environ.get("GATOR_CHAOS_SEED", "20261124")))
    with Batch(
        on_complete=AtomicBatchCompleted, on_success=AtomicBatchSucceeded, description="chaos"
    ) as batch:
        RecordWithRetry.dispatch_many(_members(rng, "b"))
    callbacks = (AtomicBatchCompleted.name, AtomicBatchSucceeded.name)
    started = time.monotonic()
    succeeded = Job.objects.filter(name__in=callbacks, state=JobState.SUCCEEDED)
    kills = _drain_with_kills(rng, tmp_path, lambda: succeeded.count() == 2)

    members = Job.objects.filter(batch_id=batch.pk)
    assert members.count() == JOBS
    assert members.filter(state=JobState.SUCCEEDED).count() == JOBS
    ledger = list(Execution.objects.values_list("label", flat=True))
    assert ledger.count(f"complete:{batch.pk}") == 1
    assert ledger.count(f"success:{batch.pk}") == 1
    assert {f"b{i}" for i in range(JOBS)} <= set(ledger)  # every member ran
    rows = list(Job.objects.filter(name__in=callbacks))
    assert sorted(r.name for r in rows) == sorted(callbacks)  # one row each
    last_member = members.aggregate(last=Max("finished_at"))["last"]
    assert all(r.created_at >= last_member for r in rows)
    row = Batch.objects.get(pk=batch.pk)
    assert row.is_complete
    assert row.completed_at >= last_member
    print(f"\nbatch chaos: {JOBS} members, {kills} SIGKILLs, {time.monotonic() - started:.1f} s")


@pytest.mark.timeout(1200)
def test_a_workflows_batch_step_under_sigkills_releases_its_dependent_exactly_once(
    tmp_path: Path,
):
    """The same drain, the batch being a workflow's step: the step after it gets one job
    (an atomic one, whose ledger row commits with its success), inserted after the last
    member ended, and runs once."""
    rng = random.Random(int(os.environ.get("GATOR_CHAOS_SEED", "20261124")) + 1)
    wf = Workflow(name="chaos")
    wf.add(AtomicBatchCompleted, 0, after=[wf.add_batch(RecordWithRetry, _members(rng, "w"))])
    run = wf.dispatch()
    started = time.monotonic()
    succeeded = WorkflowStep.objects.filter(workflow=run, state=StepState.SUCCEEDED)
    kills = _drain_with_kills(rng, tmp_path, lambda: succeeded.count() == 2)

    members = Job.objects.filter(chain_id=run.id, chain_position=0)
    assert members.count() == JOBS
    assert members.filter(state=JobState.SUCCEEDED).count() == JOBS
    after = list(Job.objects.filter(chain_id=run.id, chain_position=1))
    assert len(after) == 1  # released once
    ledger = list(Execution.objects.values_list("label", flat=True))
    assert ledger.count("complete:0") == 1
    assert {f"w{i}" for i in range(JOBS)} <= set(ledger)
    assert after[0].created_at >= members.aggregate(last=Max("finished_at"))["last"]
    print(
        f"\nbatch step chaos: {JOBS} members, {kills} SIGKILLs, {time.monotonic() - started:.1f} s"
    )
