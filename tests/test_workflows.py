"""Workflows: each step once, after all it depends on succeeded; a dead step cancels exactly
its descendants; bad graphs refused at dispatch with nothing inserted."""

from __future__ import annotations

import random
import signal
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from django_gator import Chain, Workflow
from django_gator.models import Job, JobState, Worker, WorkflowRun, WorkflowStep
from django_gator.states import StepState
from tests.conftest import run_worker, wait_for, worker_output
from tests.testapp.jobs import DagStep, Noop, WorkflowFailed
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def ledger() -> list[str]:
    return list(Execution.objects.order_by("id").values_list("label", flat=True))


def steps_by_position(run: WorkflowRun) -> dict[int, WorkflowStep]:
    return {step.position: step for step in WorkflowStep.objects.filter(workflow=run)}


def check_order(
    graph: dict[int, list[int]], ran: list[str], expect_ended: set[int]
) -> dict[int, int]:
    """Every node ended at most once; every start of a node comes after the end of each
    node it depends on; returns node -> index of its end in the ledger."""
    ends: dict[int, int] = {}
    for index, label in enumerate(ran):
        kind, node = label.split(":")
        if kind == "end":
            assert int(node) not in ends, f"node {node} ended twice"
            ends[int(node)] = index
    assert set(ends) == expect_ended
    for index, label in enumerate(ran):
        kind, node = label.split(":")
        if kind == "start":
            for parent in graph[int(node)]:
                assert ends.get(parent, len(ran)) < index, (
                    f"node {node} started (ledger row {index}) before node {parent} ended"
                )
    return ends


def test_a_diamond_runs_each_step_after_its_dependencies():
    wf = Workflow(name="order 42")
    fetch_a = wf.add(DagStep, 0)
    fetch_b = wf.add(DagStep, 1, fail_until=1)
    merge = wf.add(DagStep, 2, after=[fetch_a, fetch_b])
    wf.add(DagStep, 3, after=[merge])
    run = wf.dispatch()

    # Only the steps that wait for nothing have job rows.
    assert sorted(Job.objects.values_list("chain_position", flat=True)) == [0, 1]
    assert isinstance(run, WorkflowRun)
    assert run.name == "order 42"
    assert fetch_a.job is not None
    assert fetch_a.job.chain_id == run.id
    run_worker(concurrency=4)

    check_order({0: [], 1: [], 2: [0, 1], 3: [2]}, ledger(), {0, 1, 2, 3})
    steps = steps_by_position(run)
    assert {s.state for s in steps.values()} == {StepState.SUCCEEDED}
    jobs = {j.chain_position: j for j in Job.objects.all()}
    assert {j.state for j in jobs.values()} == {JobState.SUCCEEDED}
    assert jobs[1].attempts == 2
    assert all(steps[p].job_id == jobs[p].pk for p in range(4))


def test_a_dead_step_cancels_exactly_its_descendants_and_runs_on_error():
    wf = Workflow(name="dies", on_error=WorkflowFailed)
    a = wf.add(DagStep, 0)
    dead = wf.add(DagStep, 1, after=[a], fail_until=99)
    child = wf.add(DagStep, 2, after=[dead])
    wf.add(DagStep, 3, after=[child, a])  # a grandchild, also after a live step
    wf.add(DagStep, 4, after=[a])  # not a descendant: runs
    run = wf.dispatch()

    run_worker(concurrency=3)

    steps = steps_by_position(run)
    assert {p: s.state for p, s in steps.items()} == {
        0: StepState.SUCCEEDED,
        1: StepState.DEAD,
        2: StepState.CANCELLED,
        3: StepState.CANCELLED,
        4: StepState.SUCCEEDED,
    }
    dead_job = Job.objects.get(chain_position=1)
    assert dead_job.state == JobState.DEAD
    for position in (2, 3):
        assert steps[position].reason == f"step 1 ({DagStep.name}, job {dead_job.pk}) ended dead"
        assert steps[position].cancelled_by == 1
        assert steps[position].job_id is None
    # Cancelled steps never got a job row; the handler ran once with the dead step's job.
    assert not Job.objects.filter(chain_position__in=[2, 3]).exists()
    assert ledger().count(f"on_error:{run.id}") == 1
    assert Execution.objects.get(label=f"on_error:{run.id}").attempt == dead_job.pk
    # on_error is dispatched when step 1 dies, not after the steps still running (step 4
    # may end after it), so the order check reads the steps' own rows.
    steps_ran = [label for label in ledger() if not label.startswith("on_error:")]
    check_order({0: [], 1: [0], 2: [1], 3: [2, 0], 4: [0]}, steps_ran, {0, 4})


def test_on_dead_continue_lets_its_dependents_run():
    wf = Workflow()
    optional = wf.add(DagStep, 0, fail_until=99, on_dead="continue")
    other = wf.add(DagStep, 1)
    wf.add(DagStep, 2, after=[optional, other])
    run = wf.dispatch()

    run_worker(concurrency=2)

    steps = steps_by_position(run)
    assert [steps[p].state for p in range(3)] == [
        StepState.DEAD,
        StepState.SUCCEEDED,
        StepState.SUCCEEDED,
    ]
    assert "end:2" in ledger()


def test_an_operator_cancelling_a_waiting_step_cancels_its_descendants():
    wf = Workflow()
    first = wf.add(Noop)
    second = wf.add(Noop, after=[first])
    wf.add(Noop, after=[second])
    run = wf.dispatch()

    assert first.job is not None
    assert first.job.cancel()

    steps = steps_by_position(run)
    assert [steps[p].state for p in range(3)] == [StepState.CANCELLED] * 3
    assert steps[1].reason == f"step 0 ({Noop.name}, job {first.job.pk}) was cancelled"
    run_worker()
    assert Job.objects.count() == 1


def test_a_retried_dead_step_that_succeeds_brings_back_what_it_cancelled():
    wf = Workflow()
    flaky = wf.add(DagStep, 0, fail_until=3)  # dead after three attempts; the fourth works
    wf.add(DagStep, 1, after=[flaky])
    run = wf.dispatch()
    run_worker()
    assert steps_by_position(run)[1].state == StepState.CANCELLED

    assert Job.objects.get(chain_position=0).retry()
    run_worker()

    steps = steps_by_position(run)
    assert [steps[p].state for p in range(2)] == [StepState.SUCCEEDED, StepState.SUCCEEDED]
    assert ledger().count("end:1") == 1


def test_bad_graphs_are_refused_at_dispatch_naming_the_value():
    wf = Workflow(name="cyclic")
    a = wf.add(Noop)
    b = wf.add(Noop, after=[a])
    c = wf.add(Noop, after=[b])
    a.depends_on(c)
    with pytest.raises(
        ValueError, match=r"has a cycle: step 0 .* -> step 1 .* -> step 2 .* -> step 0 "
    ):
        wf.dispatch()

    other = Workflow(name="other")
    foreign = other.add(Noop)
    wf2 = Workflow(name="mine")
    wf2.add(Noop, after=[foreign])
    with pytest.raises(ValueError, match=r"depends on step 0 .* of another workflow.*'other'"):
        wf2.dispatch()

    wf3 = Workflow(name="typo")
    with pytest.raises(ValueError, match=r"has no step named 'fetch_a' \(steps so far: none"):
        wf3.add(Noop, after=["fetch_a"])  # a name: refused at once
    wf3.add(Noop, after=[5])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"depends on 5, which is not a step"):
        wf3.dispatch()

    with pytest.raises(ValueError, match="has no step"):
        Workflow(name="empty").dispatch()
    with pytest.raises(ValueError, match="on_dead must be 'cancel' or 'continue', got 'skip'"):
        Workflow().add(Noop, on_dead="skip")
    with pytest.raises(TypeError, match="after= takes a list of steps"):
        Workflow().add(Noop, after=a)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"tests\.testapp\.jobs\.DagStep: arguments do not fit"):
        Workflow().add(DagStep, 1, 2, 3, 4)
    bad_payload = Workflow()
    bad_payload.add(DagStep, {1, 2})
    with pytest.raises(TypeError, match="step 0"):
        bad_payload.dispatch()

    assert not Job.objects.exists()
    assert not WorkflowRun.objects.exists()
    assert not WorkflowStep.objects.exists()


def test_a_workflow_in_a_rolled_back_transaction_leaves_nothing():
    def dispatch_then_fail() -> None:
        with transaction.atomic():
            wf = Workflow()
            wf.add(Noop, after=[wf.add(Noop)])
            wf.dispatch()
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        dispatch_then_fail()
    assert not Job.objects.exists()
    assert not WorkflowRun.objects.exists()
    assert not WorkflowStep.objects.exists()

    with transaction.atomic():
        wf = Workflow()
        wf.add(Noop)
        wf.dispatch(on_commit=True)
        assert not WorkflowRun.objects.exists()  # inserted when the transaction commits
    assert WorkflowRun.objects.count() == 1
    assert Job.objects.count() == 1


def test_a_chain_is_a_workflow():
    first = Chain(Noop, Noop).dispatch()
    run = WorkflowRun.objects.get(pk=first.chain_id)
    assert [s.after for s in WorkflowStep.objects.filter(workflow=run)] == [[], [0]]


def test_a_chain_dispatched_before_workflows_is_converted_and_goes_on():
    """Migration 0009 turns an active chain of the old kind (only its current step has a
    row; the spec names the rest) into a workflow, so its later steps still run."""
    from importlib import import_module
    from types import SimpleNamespace

    from django.apps import apps
    from django.db import connection

    migration = import_module("django_gator.migrations.0009_workflows")
    chain_id = uuid.uuid4()
    spec = {"steps": [DagStep.name, DagStep.name, DagStep.name], "queue": None}
    Job.objects.create(
        name=DagStep.name,
        args=[1],
        chain_id=chain_id,
        chain_position=1,
        chain={**spec, "priority": None, "on_error": None},
    )
    migration.convert_chains(apps, SimpleNamespace(connection=connection))
    migration.convert_chains(apps, SimpleNamespace(connection=connection))  # idempotent

    run_worker()

    steps = steps_by_position(WorkflowRun.objects.get(pk=chain_id))
    assert [steps[p].state for p in range(3)] == [StepState.SUCCEEDED] * 3
    assert ledger() == ["start:1", "end:1", "start:1", "end:1"]
    assert Job.objects.filter(chain_id=chain_id).count() == 2


def random_dag(rng: random.Random, size: int) -> dict[int, list[int]]:
    """node -> the earlier nodes it depends on (0 to 3 of them)."""
    return {
        node: sorted(rng.sample(range(node), min(node, rng.choice([0, 1, 1, 2, 2, 3]))))
        for node in range(size)
    }


def descendants(graph: dict[int, list[int]], root: int) -> set[int]:
    found: set[int] = set()
    changed = True
    while changed:
        changed = False
        for node, parents in graph.items():
            if node not in found and any(p == root or p in found for p in parents):
                found.add(node)
                changed = True
    return found


def test_a_random_dag_of_50_steps_with_real_workers(spawn_worker):
    """The issue's bar: each step runs once after all its dependencies succeeded (failing
    ones retried), and a dead step cancels exactly its descendants, with three worker
    processes taking steps in parallel."""
    rng = random.Random(18)
    graph = random_dag(rng, 50)
    # The step that dies: one with a meaningful, not total, set of descendants (all of
    # which must end cancelled).
    dead = next(node for node in graph if 5 <= len(descendants(graph, node)) <= 20)
    doomed = descendants(graph, dead)
    flaky = set(rng.sample(sorted(set(graph) - doomed - {dead}), 12))
    wf = Workflow(name="random dag")
    steps = []
    for node, parents in graph.items():
        fail_until = 99 if node == dead else (1 if node in flaky else 0)
        after = [steps[p] for p in parents]
        steps.append(wf.add(DagStep, node, fail_until=fail_until, after=after))
    workers = [spawn_worker("--concurrency", "4") for _ in range(3)]
    # All three ready before the graph is: the first one up would otherwise take every
    # step of this small graph on a loaded machine, where the others start seconds later.
    wait_for(lambda: Worker.objects.count() == 3, timeout=60)
    run = wf.dispatch()

    def settled() -> bool:
        states = WorkflowStep.objects.filter(workflow=run).values_list("state", flat=True)
        return StepState.BLOCKED not in states and StepState.RELEASED not in states

    wait_for(settled, timeout=90)
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=30) == 0, worker_output(worker)

    expected_to_end = set(graph) - doomed - {dead}
    check_order(graph, ledger(), expected_to_end)
    states = {s.position: s for s in WorkflowStep.objects.filter(workflow=run)}
    assert {p for p, s in states.items() if s.state == StepState.CANCELLED} == doomed
    assert {p for p, s in states.items() if s.state == StepState.DEAD} == {dead}
    assert {p for p, s in states.items() if s.state == StepState.SUCCEEDED} == expected_to_end
    # One job per step that was released, each run once to success (two attempts if flaky).
    jobs = {j.chain_position: j for j in Job.objects.filter(chain_id=run.id)}
    assert set(jobs) == set(graph) - doomed
    for node in expected_to_end:
        assert jobs[node].attempts == (2 if node in flaky else 1), node
    starts = [label for label in ledger() if label.startswith("start:")]
    assert len(starts) == len(expected_to_end) + len(flaky) + 3
    # Parallel: more than one process took steps.
    assert Execution.objects.values("pid").distinct().count() > 1


def test_many_parents_finishing_at_once_release_each_child_exactly_once(spawn_worker):
    """A wide fan-in: 40 parallel steps, 20 steps each after two of them and one after all
    40, taken by two worker processes of 4 threads: parents finish at the same moment in
    different workers, and each child still gets exactly one job, after its parents."""
    rng = random.Random(7)
    wf = Workflow(name="fan-in")
    roots = [wf.add(DagStep, node) for node in range(40)]
    graph: dict[int, list[int]] = {node: [] for node in range(40)}
    for node in range(40, 60):
        parents = rng.sample(range(40), 2)
        graph[node] = parents
        wf.add(DagStep, node, after=[roots[p] for p in parents])
    graph[60] = list(range(40))
    wf.add(DagStep, 60, after=roots)
    workers = [spawn_worker("--concurrency", "4") for _ in range(2)]
    # Both up (their signal handlers installed) before the graph is: on a loaded machine
    # the first could finish it while the second still starts, and SIGTERM kill that one.
    wait_for(lambda: Worker.objects.count() == 2, timeout=60)
    run = wf.dispatch()

    wait_for(
        lambda: WorkflowStep.objects.filter(workflow=run, state=StepState.SUCCEEDED).count() == 61,
        timeout=90,
    )
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=30) == 0, worker_output(worker)

    check_order(graph, ledger(), set(graph))
    positions = list(Job.objects.filter(chain_id=run.id).values_list("chain_position", flat=True))
    assert sorted(positions) == list(range(61))


def test_run_jobs_and_immediate_mode_run_a_whole_graph(settings):
    from django_gator.testing import run_jobs

    wf = Workflow()
    a = wf.add(DagStep, 0)
    b = wf.add(DagStep, 1, fail_until=1)
    wf.add(DagStep, 2, after=[a, b])
    wf.dispatch()
    run_jobs()
    check_order({0: [], 1: [], 2: [0, 1]}, ledger(), {0, 1, 2})

    Execution.objects.all().delete()
    settings.GATOR_IMMEDIATE = True
    wf = Workflow()
    first = wf.add(DagStep, 10)
    wf.add(DagStep, 11, after=[first])
    run = wf.dispatch()
    assert steps_by_position(run)[1].state == StepState.SUCCEEDED
    assert ledger() == ["start:10", "end:10", "start:11", "end:11"]


#: The boundaries of a step's success, which releases the next step (test_boundaries.py
#: covers every boundary for plain jobs; a step's failure writes through the same code).
STEP_FAULTS = [
    "kill_before_success_commit",
    "kill_after_success_commit",
    "lose_success_answer",
    "lose_failure_answer",
]


@pytest.mark.parametrize("fault", STEP_FAULTS)
def test_a_fault_at_a_steps_commit_boundary_releases_its_child_exactly_once(spawn_worker, fault):
    """A worker SIGKILLed, or losing the answer of its commit, around the write of a step's
    outcome (which releases the next step): the next step gets exactly one job and runs
    once, after the first step's successful run."""
    wf = Workflow()
    first = wf.add(DagStep, 0, fail_until=1 if "failure" in fault else 0)
    wf.add(DagStep, 1, after=[first])
    run = wf.dispatch()
    run_with_fault(spawn_worker, fault, lambda: succeeded_steps(run) == 2)

    assert Job.objects.filter(chain_id=run.id, chain_position=1).count() == 1
    ran = ledger()
    assert ran.count("start:1") == ran.count("end:1") == 1
    assert ran.index("start:1") > ran.index("end:0")
    assert not Job.objects.filter(state=JobState.RUNNING).exists()


def succeeded_steps(run: WorkflowRun) -> int:
    return WorkflowStep.objects.filter(workflow=run, state=StepState.SUCCEEDED).count()


def run_with_fault(spawn_worker: Any, fault: str, done: Callable[[], bool]) -> None:
    """A worker that injects ``fault`` (tests/reliability/test_boundaries.py), and, if the
    fault killed it, a clean one, until ``done()``; then stopped, the fault seen in its log."""
    from tests.reliability.test_boundaries import FAST

    faulty = spawn_worker("--concurrency", "1", env={**FAST, "GATOR_TEST_FAULT": fault})
    if fault.startswith("kill_"):
        assert faulty.wait(timeout=60) == -signal.SIGKILL, worker_output(faulty)
        finisher = spawn_worker("--concurrency", "1", env=FAST)
    else:
        finisher = faulty
    wait_for(done, timeout=60)
    finisher.send_signal(signal.SIGTERM)
    assert finisher.wait(timeout=30) == 0, worker_output(finisher)
    assert f"FAULT {fault}" in worker_output(faulty)
