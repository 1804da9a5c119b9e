"""Issue 34's bar for durable workflows: a 30-step workflow (atomic steps that pass results,
three waits for signals, three sleeps) drained by three worker processes SIGKILLed at
random (one running a step when there is one) and restarted, while its signals arrive
(one before its wait is reached, each sent twice). Then a ledger proves it: every step ran
once (an atomic step's ledger row commits with its success mark: exactly one per step; a
step has one job row), after the steps it comes after, with their results as its inputs;
the waits' results are the signals' payloads; ``run.wait_result()``, called from another
thread while the workers were being killed, returned the leaves' results; nothing is left
running, blocked or released; every kill was made and at least one cut a step short.

GATOR_WORKFLOW_CHAOS_KILLS (default 4) SIGKILLs; GATOR_CHAOS_SEED picks the graph.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections

from django_gator import Workflow
from django_gator.models import Job, JobState, Worker, WorkflowRun, WorkflowStep
from django_gator.states import StepState
from tests.chaos import _retry_db
from tests.testapp.jobs import LedgerStep
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

KILLS = int(os.environ.get("GATOR_WORKFLOW_CHAOS_KILLS", "4"))
WORKERS = 3
STEPS = 30
WAITS = ("approved", "paid", "packed")
SLEEPS = 3


def _graph(rng: random.Random) -> tuple[Workflow, dict[str, list[str]]]:
    """30 steps: atomic ledger steps, 3 waits and 3 sleeps at random places, each after
    one to three earlier steps (the first four after none). Returns the workflow and each
    step's parents by name."""
    kinds = ["step"] * (STEPS - len(WAITS) - SLEEPS) + ["wait"] * len(WAITS) + ["sleep"] * SLEEPS
    rng.shuffle(kinds)
    kinds[:4] = ["step"] * 4  # roots are ledger steps; the kinds moved out go at the end
    kinds = kinds[:STEPS]
    while kinds.count("wait") < len(WAITS):
        kinds[kinds.index("step", 4)] = "wait"
    while kinds.count("sleep") < SLEEPS:
        kinds[kinds.index("step", 4)] = "sleep"
    wf = Workflow(name="chaos order")
    parents: dict[str, list[str]] = {}
    waits = iter(WAITS)
    for i, kind in enumerate(kinds):
        after = [] if i < 4 else sorted(rng.sample(list(parents), rng.randint(1, min(3, i))))
        name = f"{kind}{i}"
        if kind == "wait":
            wf.add_wait(next(waits), after=after, timeout=timedelta(hours=1), name=name)
        elif kind == "sleep":
            wf.add_sleep(rng.uniform(0.3, 1.0), after=after, name=name)
        else:
            wf.add(LedgerStep, name, round(rng.uniform(0.05, 0.6), 3), after=after, name=name)
        parents[name] = after
    return wf, parents


def _pids_running_a_step() -> list[int]:
    running = Job.objects.filter(state=JobState.RUNNING).values("reserved_by")
    return list(Worker.objects.filter(id__in=running).values_list("pid", flat=True))


def _drain(
    rng: random.Random,
    spawn: Callable[..., Any],
    run: WorkflowRun,
    done: Callable[[], bool],
    sent: dict[str, Any],
) -> int:
    """Three workers, one of them (running a step, if one does) SIGKILLed and replaced
    every 0.8-1.6 s (KILLS times), the next signal not in ``sent`` sent at every other turn
    (twice: the second is refused), until ``done()``. Returns the kills; ``sent`` gets the
    payloads delivered, by signal name."""
    args = ("--concurrency", "3")
    env = {"GATOR_HEARTBEAT_TIMEOUT": "3", "GATOR_MAX_RESCUES": "10", "GATOR_POLL_INTERVAL": "0.2"}
    procs = [spawn(*args, env=env) for _ in range(WORKERS)]
    kills, turn = 0, 0
    started = time.monotonic()
    while not _retry_db(done):
        assert time.monotonic() - started < 90, "the workflow did not finish"
        time.sleep(rng.uniform(0.8, 1.6))  # deliberate: the gap between two faults
        turn += 1
        if turn % 2 == 1 and len(sent) < len(WAITS):
            name = next(w for w in WAITS if w not in sent)
            payload = {"signal": name, "turn": turn}
            assert _retry_db(lambda n=name, p=payload: run.signal(n, p, by="chaos")) is True
            assert _retry_db(lambda n=name: run.signal(n, {"again": True})) is False
            sent[name] = payload
        if kills < KILLS:
            busy = set(_retry_db(_pids_running_a_step))
            registered = set(_retry_db(lambda: list(Worker.objects.values_list("pid", flat=True))))
            alive = [p for p in procs if p.poll() is None and p.pid in registered]
            # A worker running a step if there is one: the kill then cuts an attempt short.
            targets = [p for p in alive if p.pid in busy] or alive
            if targets:
                victim = rng.choice(targets)
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                kills += 1
                procs[procs.index(victim)] = spawn(*args, env=env)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout=30)
    return kills


@pytest.mark.timeout(300)
def test_a_workflow_under_sigkills_runs_each_step_once_with_its_inputs(spawn_worker):
    rng = random.Random(int(os.environ.get("GATOR_CHAOS_SEED", "20261127")))
    wf, parents = _graph(rng)
    run = wf.dispatch()
    first = WAITS[0]
    sent = {first: {"signal": first, "turn": 0}}
    assert run.signal(first, sent[first]) is True  # before its wait is reached
    waited: dict[str, Any] = {}

    def wait() -> None:
        try:
            waited["results"] = run.wait_result(timeout=120)
        except BaseException as exc:  # reported by the main thread
            waited["error"] = exc
        finally:
            connections.close_all()

    waiter = threading.Thread(target=wait, name="wait-result")
    waiter.start()
    started = time.monotonic()
    steps = WorkflowStep.objects.filter(workflow=run)
    ended = steps.filter(state=StepState.SUCCEEDED)
    kills = _drain(rng, spawn_worker, run, lambda: ended.count() == STEPS, sent)
    waiter.join(timeout=60)
    assert "error" not in waited, waited.get("error")

    rows = {s.label: s for s in steps}
    jobs = {j.chain_position: j for j in Job.objects.filter(chain_id=run.pk)}
    assert len(jobs) == STEPS == Job.objects.filter(chain_id=run.pk).count()  # one job each
    assert all(j.state == JobState.SUCCEEDED for j in jobs.values())
    assert not Job.objects.filter(state=JobState.RUNNING).exists()
    result = {name: jobs[rows[name].position].result for name in rows}
    ledger = list(Execution.objects.values_list("label", flat=True))
    for name, after in parents.items():
        job = jobs[rows[name].position]
        assert all(job.created_at >= jobs[rows[p].position].finished_at for p in after), name
        if name.startswith("step"):
            assert ledger.count(name) == 1, f"{name} ran {ledger.count(name)} times"
            assert result[name] == {"label": name, "inputs": {p: result[p] for p in after}}
        elif name.startswith("wait"):
            assert result[name] == sent[rows[name].wait_for]
    assert len(ledger) == STEPS - len(WAITS) - SLEEPS
    leaves = {name for name in parents if not any(name in after for after in parents.values())}
    assert waited["results"] == {name: result[name] for name in leaves}
    rescued = sum(j.rescues for j in jobs.values())
    assert kills == KILLS, "the workflow ended before every kill was made"
    assert rescued >= 1, "no kill cut a step short"
    print(
        f"\nworkflow chaos: {STEPS} steps, {kills} SIGKILLs, {rescued} rescues, "
        f"{time.monotonic() - started:.1f} s"
    )


def test_graph_is_what_the_chaos_test_claims():
    """The graph's shape does not rot as the seed changes: 30 steps, 3 waits, 3 sleeps."""
    _, parents = _graph(random.Random(int(os.environ.get("GATOR_CHAOS_SEED", "20261127"))))
    kinds = [name.rstrip("0123456789") for name in parents]
    assert (len(kinds), kinds.count("wait"), kinds.count("sleep")) == (STEPS, 3, SLEEPS)
