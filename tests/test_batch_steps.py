"""A workflow step that is a batch: its members run once the step's dependencies
succeeded, its dependents once every member succeeded; a dead member ends the step dead
(cancelling its dependents, with the reason) and a retried member that succeeds brings
them back; members known only at run time are added by a member; bad input is refused at
dispatch with nothing inserted; the admin draws it and links it to its batch."""

from __future__ import annotations

import random
import signal
from datetime import timedelta

import pytest
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from django_gator import Workflow
from django_gator.admin.workflows import render_graph
from django_gator.models import (
    Batch,
    BatchError,
    Job,
    JobState,
    Worker,
    WorkflowRun,
    WorkflowStep,
)
from django_gator.states import StepState
from django_gator.testing import run_jobs
from tests.admin_helpers import operator
from tests.conftest import run_worker, wait_for, worker_output
from tests.test_workflows import (
    descendants,
    random_dag,
    run_with_fault,
    steps_by_position,
    succeeded_steps,
)
from tests.testapp.jobs import DagStep, Echo, FanOut, Noop, Record, WorkflowFailed
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def ledger() -> list[str]:
    return list(Execution.objects.order_by("id").values_list("label", flat=True))


def members(node: int, count: int, **extra: object) -> list[dict[str, object]]:
    return [{"node": node, "member": m, **extra} for m in range(count)]


def check_order(graph: dict[int, list[int]], ran: list[str]) -> dict[int, int]:
    """Each run (a step, or a member ``node.m`` of a batch step) ended at most once; every
    start of a node's run comes after the end of every run of each node it depends on
    (every member, for a batch step). Returns node -> index of its last end."""
    ends: dict[str, int] = {}
    for index, label in enumerate(ran):
        kind, name = label.split(":")
        if kind == "end":
            assert name not in ends, f"{name} ended twice"
            ends[name] = index
    last: dict[int, int] = {}
    for name, index in ends.items():
        node = int(name.split(".")[0])
        last[node] = max(last.get(node, -1), index)
    for index, label in enumerate(ran):
        kind, name = label.split(":")
        if kind != "start":
            continue
        for parent in graph[int(name.split(".")[0])]:
            runs = [n for n in ends if n.split(".")[0] == str(parent)]
            assert runs, f"{name} started, but {parent} never ended"
            assert all(ends[n] < index for n in runs), (
                f"{name} started (ledger row {index}) before every run of {parent} ended"
            )
    return last


def test_a_batch_step_runs_between_its_dependencies_and_its_dependents():
    wf = Workflow(name="album 7")
    fetch = wf.add(DagStep, 0)
    resize = wf.add_batch(
        DagStep, [*members(1, 4), {"node": 1, "member": 4, "fail_until": 1}], after=[fetch]
    )
    wf.add(DagStep, 2, after=[resize])
    run = wf.dispatch()

    # Blocked: its members wait in the step's row, not in the jobs table.
    step = steps_by_position(run)[1]
    assert step.state == StepState.BLOCKED
    assert step.is_batch
    assert step.batch_id is None
    assert step.members == [[[], m] for m in members(1, 4)] + [
        [[], {"node": 1, "member": 4, "fail_until": 1}]
    ]
    assert Job.objects.count() == 1
    assert not Batch.objects.exists()

    run_worker(concurrency=3)

    check_order({0: [], 1: [0], 2: [1]}, ledger())
    steps = steps_by_position(run)
    assert [steps[p].state for p in range(3)] == [StepState.SUCCEEDED] * 3
    batch = Batch.objects.get(pk=steps[1].batch_id)
    assert steps[1].members == []  # released: the members are job rows now
    assert batch.closed
    assert batch.size == 5
    assert batch.is_complete
    assert batch.description == "album 7: step 1 (tests.testapp.jobs.DagStep)"
    member_rows = list(batch.members)
    assert {(j.chain_id, j.chain_position) for j in member_rows} == {(run.id, 1)}
    assert {j.state for j in member_rows} == {JobState.SUCCEEDED}
    assert sorted(j.attempts for j in member_rows) == [1, 1, 1, 1, 2]
    # No callbacks: the workflow's next step is what follows the batch.
    assert Job.objects.count() == 1 + 5 + 1


def test_a_first_batch_step_is_inserted_at_dispatch():
    wf = Workflow()
    spread = wf.add_batch(DagStep, members(0, 3))
    wf.add(DagStep, 1, after=[spread])
    run = wf.dispatch()

    assert spread.job is None
    assert spread.batch is not None
    assert spread.batch.pk is not None
    step = steps_by_position(run)[0]
    assert step.state == StepState.RELEASED
    assert step.batch_id == spread.batch.pk
    assert step.members == []
    assert spread.batch.members.count() == 3
    assert Batch.objects.get(pk=spread.batch.pk).closed
    run_jobs()
    check_order({0: [], 1: [0]}, ledger())
    assert steps_by_position(run)[1].state == StepState.SUCCEEDED


def test_a_dead_member_cancels_the_dependents_and_a_retried_one_brings_them_back():
    wf = Workflow(name="dies", on_error=WorkflowFailed)
    # Member 1 dies after three attempts (its fourth, after a retry, works); member 2 is
    # held back (scheduled later) while that happens.
    resize = wf.add_batch(
        DagStep,
        [{"node": 1, "member": 0}, {"node": 1, "member": 1, "fail_until": 3}, members(1, 3)[2]],
    )
    child = wf.add(DagStep, 2, after=[resize])
    wf.add(DagStep, 3, after=[child])
    wf.add(DagStep, 4)  # not after the batch: runs
    run = wf.dispatch()
    assert resize.batch is not None
    batch_id = resize.batch.pk
    held = resize.batch.members.get(kwargs__member=2)
    Job.objects.filter(pk=held.pk).update(next_execution_at=timezone.now() + timedelta(days=1))

    run_worker(concurrency=2)

    dead = Job.objects.get(batch_id=batch_id, state=JobState.DEAD)
    steps = steps_by_position(run)
    # Dead at once, though member 2 has not run: its dependents cannot run any more.
    assert [steps[p].state for p in range(4)] == [
        StepState.DEAD,
        StepState.CANCELLED,
        StepState.CANCELLED,
        StepState.SUCCEEDED,
    ]
    assert steps[0].reason == f"batch {batch_id}, job {dead.pk} ended dead"
    reason = f"step 0 ({DagStep.name}, batch {batch_id}, job {dead.pk}) ended dead"
    assert steps[1].reason == steps[2].reason == reason
    assert steps[1].cancelled_by == steps[2].cancelled_by == 0
    assert ledger().count(f"on_error:{run.id}") == 1
    assert Execution.objects.get(label=f"on_error:{run.id}").attempt == dead.pk

    # The operator retries the dead member: it succeeds while member 2 still waits, so
    # the step runs again and what it cancelled waits for it again.
    assert dead.retry()
    run_worker()
    steps = steps_by_position(run)
    assert steps[0].state == StepState.RELEASED
    assert steps[0].reason == ""
    assert steps[1].state == steps[2].state == StepState.BLOCKED
    assert steps[1].reason == ""
    assert steps[1].cancelled_by is None
    assert Batch.objects.get(pk=batch_id).is_complete is False

    Job.objects.filter(pk=held.pk).update(next_execution_at=timezone.now())
    run_worker()
    steps = steps_by_position(run)
    assert [steps[p].state for p in range(4)] == [StepState.SUCCEEDED] * 4
    check_order({1: [], 2: [1], 3: [2], 4: []}, ledger())
    assert ledger().count("end:2") == ledger().count("end:3") == 1
    assert ledger().count(f"on_error:{run.id}") == 1


def test_on_dead_continue_waits_for_every_member_then_lets_the_dependents_run():
    wf = Workflow()
    optional = wf.add_batch(
        DagStep,
        [{"node": 0, "member": 0, "fail_until": 99}, *members(0, 3)[1:]],
        on_dead="continue",
    )
    wf.add(DagStep, 1, after=[optional])
    run = wf.dispatch()
    run_worker(concurrency=2)

    steps = steps_by_position(run)
    assert [steps[0].state, steps[1].state] == [StepState.DEAD, StepState.SUCCEEDED]
    ran = ledger()
    assert ran.index("start:1") > max(ran.index("end:0.1"), ran.index("end:0.2"))
    assert ran.index("start:1") > max(i for i, label in enumerate(ran) if label == "start:0.0")


def test_an_operator_cancelling_a_member_cancels_the_dependents():
    wf = Workflow()
    spread = wf.add_batch(Noop, [[], []])
    after = wf.add(Noop, after=[spread])
    run = wf.dispatch()
    assert spread.batch is not None
    victim = spread.batch.members.first()
    assert victim is not None
    assert victim.cancel()

    steps = steps_by_position(run)
    assert steps[0].state == StepState.CANCELLED
    assert steps[1].state == StepState.CANCELLED
    assert steps[1].reason == (
        f"step 0 ({Noop.name}, batch {spread.batch.pk}, job {victim.pk}) was cancelled"
    )
    run_worker()
    assert after.job is None
    assert not Job.objects.filter(chain_position=1).exists()
    assert steps_by_position(run)[0].state == StepState.CANCELLED  # the other one ran


def test_members_known_only_at_run_time_are_added_by_a_member():
    wf = Workflow(name="fan out")
    first = wf.add(DagStep, 0)
    fan = wf.add_batch(FanOut, [[1, 4]], after=[first])  # adds DagStep 1.1 .. 1.4
    wf.add(DagStep, 2, after=[fan])
    run = wf.dispatch()
    run_worker(concurrency=3)

    check_order({0: [], 1: [0], 2: [1]}, ledger())
    steps = steps_by_position(run)
    assert [steps[p].state for p in range(3)] == [StepState.SUCCEEDED] * 3
    batch = Batch.objects.get(pk=steps[1].batch_id)
    assert batch.size == 5
    added = batch.members.filter(name=DagStep.name)
    assert added.count() == 4
    assert {(j.chain_id, j.chain_position) for j in added} == {(run.id, 1)}
    assert set(ledger()) >= {f"end:1.{m}" for m in range(5)}


def test_a_fan_out_member_that_dies_ends_the_step_dead_and_adds_nothing():
    wf = Workflow()
    fan = wf.add_batch(FanOut, [[0, 3]])
    wf.add(DagStep, 1, after=[fan])
    run = wf.dispatch()
    # Every attempt of the fan-out fails (an argument its handle() does not take).
    assert fan.batch is not None
    Job.objects.filter(batch_id=fan.batch.pk).update(kwargs={"bogus": 1})
    run_worker()
    steps = steps_by_position(run)
    assert [steps[0].state, steps[1].state] == [StepState.DEAD, StepState.CANCELLED]
    assert fan.batch.members.count() == 1  # its atomic attempts added nothing


def test_only_a_running_member_adds_to_a_closed_batch():
    wf = Workflow()
    spread = wf.add_batch(Noop, [[]])
    wf.dispatch()
    assert spread.batch is not None
    member = spread.batch.members.get()
    # Not a running job's: a closed batch refuses it.
    with pytest.raises(BatchError, match="is closed: no job can join it"):
        spread.batch.add(Noop)
    run_jobs()
    # Its member has ended: it cannot add any more.
    ended = Batch.of_member(member.pk)
    assert ended is not None
    assert ended.step_of == (member.chain_id, 0)
    with pytest.raises(BatchError, match=rf"job {member.pk} is no longer an active member"):
        ended.add(Noop)
    assert Batch.of_member(Noop.dispatch().pk) is None  # not in a batch
    assert spread.batch.members.count() == 1


@override_settings(GATOR_MAX_BATCH_SIZE=3)
def test_a_member_cannot_grow_its_batch_past_the_limit():
    with Batch() as batch:
        first = Noop.dispatch()
    extending = Batch.of_member(first.pk)
    assert extending is not None
    extending.add_many(Noop, [[], []])
    with pytest.raises(BatchError, match="would have 4 members, more than GATOR_MAX_BATCH"):
        extending.add(Noop)
    assert batch.members.count() == 3


def test_bad_batch_steps_are_refused_at_dispatch_naming_the_value():
    def nothing_inserted() -> None:
        assert not Job.objects.exists()
        assert not WorkflowRun.objects.exists()
        assert not WorkflowStep.objects.exists()
        assert not Batch.objects.exists()

    wf = Workflow(name="empty")
    wf.add(Noop, after=[wf.add_batch(Record, [])])
    with pytest.raises(ValueError, match=r"step 0 \(.*Record\) of .*'empty'.* is a batch with no"):
        wf.dispatch()
    nothing_inserted()

    with override_settings(GATOR_MAX_BATCH_SIZE=2):
        big = Workflow(name="big")
        big.add_batch(Record, [["a"], ["b"], ["c"]])
        with pytest.raises(ValueError, match="a batch of 3 members, more than GATOR_MAX_BATCH"):
            big.dispatch()
    nothing_inserted()

    with pytest.raises(TypeError, match=r"step 0 .*, batch item 1: .*arguments do not fit"):
        Workflow().add_batch(Record, [["a"], ["a", "b", "c", "d"]])
    with pytest.raises(TypeError, match=r"add_batch\(\) item 0 is an int"):
        Workflow().add_batch(Record, [7])
    not_json = Workflow()
    not_json.add(Noop)
    not_json.add_batch(Record, [["fine"], [{1, 2}]])
    with pytest.raises(TypeError, match=r"step 1 .*, batch item 1: .*set"):
        not_json.dispatch()
    nothing_inserted()
    with pytest.raises(ValueError, match="on_dead must be 'cancel' or 'continue', got 'x'"):
        Workflow().add_batch(Record, [["a"]], on_dead="x")


def test_run_jobs_and_immediate_mode_run_a_graph_with_a_batch_step(settings):
    wf = Workflow()
    first = wf.add(DagStep, 0)
    wf.add(DagStep, 2, after=[wf.add_batch(DagStep, members(1, 3), after=[first])])
    wf.dispatch()
    run_jobs()
    check_order({0: [], 1: [0], 2: [1]}, ledger())

    Execution.objects.all().delete()
    settings.GATOR_IMMEDIATE = True
    wf = Workflow()
    wf.add(DagStep, 11, after=[wf.add_batch(DagStep, members(10, 2))])
    run = wf.dispatch()
    assert steps_by_position(run)[1].state == StepState.SUCCEEDED
    check_order({10: [], 11: [10]}, ledger())


def test_the_workflow_page_draws_a_batch_step_and_its_batch_page_links_back():
    wf = Workflow(name="<b>album</b>")
    first = wf.add(DagStep, 0)
    done = wf.add_batch(DagStep, members(1, 3), after=[first])
    wf.add_batch(Echo, [[n] for n in range(4)], after=[done])  # its own queue: left waiting
    wf.add(DagStep, 3, after=[first], fail_until=99)
    run = wf.dispatch()
    run_jobs(raise_errors=False, queue="default")

    steps = steps_by_position(run)
    svg = render_graph(run)
    batch_url = reverse("admin:django_gator_job_batch", args=[steps[1].batch_id])
    assert svg.count("gator-batch-step") == 2
    assert f'<a href="{batch_url}">' in svg
    assert "succeeded · 3/3 succeeded" in svg
    assert "waiting · 0/4 succeeded" in svg
    assert "<b>" not in svg

    client = operator("view_workflowrun")
    page = client.get(reverse("admin:django_gator_workflowrun_change", args=[run.pk]))
    html = page.content.decode()
    assert f'<a href="{batch_url}">batch #{steps[1].batch_id}</a> (3/3 succeeded)' in html
    batch_page = client.get(batch_url).content.decode()
    workflow_url = reverse("admin:django_gator_workflowrun_change", args=[run.pk])
    assert f'<a href="{workflow_url}">&lt;b&gt;album&lt;/b&gt;</a>' in batch_page
    assert "Step 1 of the workflow" in batch_page

    blocked = Workflow()
    blocked.add_batch(Noop, [[]] * 5, after=[blocked.add(Noop)])
    later = blocked.dispatch()
    assert "blocked · 5 members" in render_graph(later)


def test_a_random_dag_with_batch_steps_and_real_workers(spawn_worker):
    """Issue 18's random DAG, some of whose steps are batches (one of them fanning out at
    run time), with flaky members retried by their policy and one member that dies: every
    run starts after every run of each step it depends on ended (for a batch step, every
    member), the dead member's step cancels exactly its descendants, and the operator's
    retry of that member, which then succeeds, brings them back to run once each."""
    rng = random.Random(1818)
    graph = random_dag(rng, 30)
    candidates = [n for n in graph if 3 <= len(descendants(graph, n)) <= 12 and graph[n]]
    dying = candidates[0]
    doomed = descendants(graph, dying)
    batches = set(rng.sample(sorted(set(graph) - {dying}), 6)) | {dying}
    fan_out = rng.choice(sorted(batches - {dying} - doomed))
    wf = Workflow(name="random dag with batches")
    steps = []
    sizes = {}
    for node, parents in graph.items():
        after = [steps[p] for p in parents]
        if node == fan_out:
            sizes[node] = 4
            steps.append(wf.add_batch(FanOut, [[node, 3, 2, 1]], after=after))
        elif node in batches:
            sizes[node] = rng.randint(2, 8)
            items = members(node, sizes[node])
            flaky = rng.randrange(sizes[node])
            items[flaky]["fail_until"] = 3 if node == dying else 1
            steps.append(wf.add_batch(DagStep, items, after=after))
        else:
            steps.append(wf.add(DagStep, node, after=after, fail_until=rng.choice([0, 0, 1])))
    workers = [spawn_worker("--concurrency", "4") for _ in range(3)]
    # Every worker up before the work comes (a SIGTERM before a worker's signal handlers
    # are installed would kill it, not stop it).
    wait_for(lambda: Worker.objects.count() == 3, timeout=60)
    run = wf.dispatch()

    def settled() -> bool:
        states = set(WorkflowStep.objects.filter(workflow=run).values_list("state", flat=True))
        return not states & {StepState.BLOCKED, StepState.RELEASED}

    wait_for(settled, timeout=120)
    states = {s.position: s.state for s in WorkflowStep.objects.filter(workflow=run)}
    assert {p for p, s in states.items() if s == StepState.DEAD} == {dying}
    assert {p for p, s in states.items() if s == StepState.CANCELLED} == doomed
    check_order(graph, ledger())

    dead = Job.objects.get(chain_id=run.id, state=JobState.DEAD)
    assert dead.chain_position == dying
    assert dead.retry()
    wait_for(
        lambda: (
            WorkflowStep.objects.filter(workflow=run, state=StepState.SUCCEEDED).count()
            == len(graph)
        ),
        timeout=120,
    )
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=30) == 0, worker_output(worker)

    ran = ledger()
    check_order(graph, ran)
    for node in graph:
        runs = {
            label for label in ran if label.startswith(f"end:{node}.") or label == f"end:{node}"
        }
        assert len(runs) == sizes.get(node, 1), node
    for node in batches:
        step = WorkflowStep.objects.get(workflow=run, position=node)
        batch = Batch.objects.get(pk=step.batch_id)
        assert batch.size == sizes[node]
        assert batch.is_complete
    assert Execution.objects.values("pid").distinct().count() > 1


#: The boundaries of a member's outcome (test_workflows.py covers a plain step's).
MEMBER_FAULTS = ["kill_before_success_commit", "kill_after_success_commit", "lose_success_answer"]


@pytest.mark.parametrize("fault", MEMBER_FAULTS)
def test_a_fault_at_a_members_commit_boundary_releases_the_next_step_once(spawn_worker, fault):
    """A worker SIGKILLed, or losing its commit's answer, around the success of a batch
    step's last member (which releases the next step): the next step gets one job and
    runs once, after every member's successful run."""
    wf = Workflow()
    wf.add(DagStep, 1, after=[wf.add_batch(DagStep, members(0, 2))])
    run = wf.dispatch()
    run_with_fault(spawn_worker, fault, lambda: succeeded_steps(run) == 2)

    assert Job.objects.filter(chain_id=run.id, chain_position=1).count() == 1
    ran = ledger()
    assert ran.count("start:1") == ran.count("end:1") == 1
    assert ran.index("start:1") > max(ran.index("end:0.0"), ran.index("end:0.1"))
    assert not Job.objects.filter(state=JobState.RUNNING).exists()
