"""Property tests (hypothesis): the job state machine driven through the engine on the real
database with an injected clock, what dispatch stores, and the ``-q NAME,WEIGHT`` parser.

The clock: leases, due times and heartbeats are compared with database time, so the state
machine never sleeps. "Time passes" moves every ``next_execution_at``, ``locked_at`` and
``heartbeat_at`` into the past by whole ticks of 1000 s, and a lapsed heartbeat is one moved
a day back. Scheduled times sit 500 s off the tick grid (a job waits 500 s, 1500 s or
2500 s; a heartbeat lapses after 2500 s), so the few seconds an example really takes never
decide whether a job is due or a worker lost.
"""

from __future__ import annotations

import importlib
import json
import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple

import pytest
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from hypothesis import HealthCheck, given, note
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_gator import Queueable
from django_gator.attempts import Claim as EngineClaim
from django_gator.attempts import Failure, Mark
from django_gator.dispatch import enqueue
from django_gator.engines import get_engine
from django_gator.engines.base import ClaimedJob, Engine
from django_gator.models import FINAL_STATES, READY_STATES, Job, JobState, Worker
from django_gator.validation import QUEUE_MAX_LENGTH, QUEUE_RE, check_json
from django_gator.worker.errors import error_entry
from django_gator.worker.queues import (
    MAX_WEIGHT,
    QueueSpec,
    parse_queue_spec,
    parse_queue_specs,
    weighted_order,
)
from django_gator.worker.supervisor import WorkerProcess

# The round-trip oracle and value strategies of the check_json tests, shared rather than
# copied (imported by name so that mypy leaves that untyped module alone).
validation_tests = importlib.import_module("tests.test_validation")

# Data generation (regex names, filters) can be slow on a loaded machine: no too_slow check.
pure = hsettings(database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Noop(Queueable):
    """Takes any arguments and does nothing; the rows are driven by hand."""

    def handle(self, *args: Any, **kwargs: Any) -> None:
        return None


# -- 1. the job state machine against the database ------------------------------------------

TICK = 1000  # seconds the injected clock moves per tick
HEARTBEAT_TIMEOUT = 2500  # GATOR_HEARTBEAT_TIMEOUT during the state machine
MAX_RESCUES = 2  # GATOR_MAX_RESCUES (crashes alone; this machine never isolates a job)
WORKERS = ("w-a", "w-b", "w-c")
QUEUES = ("pa", "pb")
READY = {s.value for s in READY_STATES}
FINAL = {s.value for s in FINAL_STATES}
#: Columns every snapshot reads.
COLUMNS = (
    "state",
    "attempts",
    "reserved_by",
    "locked_at",
    "started_at",
    "finished_at",
    "rescues",
    "queue",
    "priority",
    "cancel_requested",
    "errors",
    "last_error",
    "error_class",
    "next_execution_at",
    "result",
    "audit",
)
#: Columns the injected clock moves.
CLOCK_COLUMNS = {"next_execution_at", "locked_at"}
#: (dispatch option, its offset from the model clock in seconds)
WHENS = ("now", "wait=0", "wait=500s", "wait=1500.0", "at=-500s", "at=+2500s")

Row = dict[str, Any]


class Claim(NamedTuple):
    """What a worker holds after a claim: every later write is a compare-and-set on it."""

    id: int
    attempts: int
    owner: str


@dataclass
class ModelJob:
    id: int
    queue: str
    priority: int
    due_at: int  # model clock, in seconds
    state: str = JobState.WAITING.value
    attempts: int = 0
    reserved_by: str | None = None
    rescues: int = 0
    errors: int = 0
    cancel_requested: bool = False
    result: Any = None

    def current(self) -> Claim | None:
        if self.state != JobState.RUNNING or self.reserved_by is None:
            return None
        return Claim(self.id, self.attempts, self.reserved_by)


@dataclass
class Op:
    """What the last step did, for the checks of the move from the previous snapshot."""

    kind: str
    changed: frozenset[int] = frozenset()  # rows the step was expected to write
    untouched: frozenset[int] = frozenset()  # rows written with a stale claim: must not move


def snapshot() -> dict[int, Row]:
    return {row["id"]: row for row in Job.objects.order_by("id").values("id", *COLUMNS)}


def when_options(when: str) -> tuple[dict[str, Any], int]:
    """dispatch() keyword arguments for ``when`` and the job's due time from now."""
    now = timezone.now()
    options: dict[str, tuple[dict[str, Any], int]] = {
        "now": ({}, 0),
        "wait=0": ({"wait": 0}, 0),
        "wait=500s": ({"wait": timedelta(seconds=500)}, 500),
        "wait=1500.0": ({"wait": 1500.0}, 1500),
        "at=-500s": ({"at": now - timedelta(seconds=500)}, -500),
        "at=+2500s": ({"at": now + timedelta(seconds=2500)}, 2500),
    }
    return options[when]


def check_rows(rows: dict[int, Row]) -> None:
    """What holds for every row at every moment, whatever happened before."""
    valid = set(JobState.values)
    for pk, row in rows.items():
        state = row["state"]
        errors = row["errors"] or []
        where = f"job {pk}: {row}"
        assert state in valid, where
        if state == JobState.RUNNING:
            assert row["reserved_by"] is not None, where
            assert row["locked_at"] is not None, where
            assert row["started_at"] is not None, where
            assert row["attempts"] >= 1, where
            assert row["finished_at"] is None, where
        if state in READY:
            assert row["finished_at"] is None, where
            assert not row["cancel_requested"], where
        if state in FINAL:
            assert row["finished_at"] is not None, where
        if state == JobState.FAILED:
            assert errors, where
        if row["attempts"] == 0:
            assert state in (JobState.WAITING, JobState.CANCELLED), where
            assert row["started_at"] is None, where
            assert row["errors"] is None, where
        # Each error belongs to an attempt (a failure or a rescue), never two to one attempt.
        assert len(errors) <= row["attempts"], where
        assert row["rescues"] <= row["attempts"], where


def check_move(before: dict[int, Row], after: dict[int, Row], op: Op) -> None:
    """What may change between two snapshots, given the one step taken in between."""
    moved = CLOCK_COLUMNS if op.kind == "advance" else set()

    def same(old: Row, new: Row) -> bool:
        return all(old[c] == new[c] for c in COLUMNS if c not in moved)

    for pk, old in before.items():
        assert pk in after, f"job {pk} disappeared after {op}"
        new = after[pk]
        where = f"job {pk} after {op}:\n  before {old}\n  after  {new}"
        if pk in op.untouched:
            assert same(old, new), "a write with a stale claim changed the row: " + where
        if old["state"] in FINAL:
            if op.kind == "retry" and pk in op.changed:
                assert (old["state"], new["state"]) == (JobState.DEAD, JobState.WAITING), where
            elif op.kind == "discard" and pk in op.changed:
                assert (old["state"], new["state"]) == (JobState.DEAD, JobState.CANCELLED), where
            else:
                assert same(old, new), "a finished row changed: " + where
        if new["attempts"] < old["attempts"]:
            # Only a release gives an attempt back, and only the one its claim took.
            assert op.kind == "release", where
            assert pk in op.changed, where
            assert new["attempts"] == old["attempts"] - 1, where
        assert new["rescues"] >= old["rescues"], where
        old_errors = old["errors"] or []
        assert (new["errors"] or [])[: len(old_errors)] == old_errors, where
        if old["state"] == JobState.RUNNING and new["state"] == JobState.RUNNING:
            # Nobody takes over a claim that is still held.
            for column in ("reserved_by", "attempts", "started_at"):
                assert old[column] == new[column], where
        if new["state"] == JobState.RUNNING and old["state"] != JobState.RUNNING:
            assert op.kind in ("claim", "claim_by_id"), where
            assert old["state"] in READY, where
            assert new["attempts"] == old["attempts"] + 1, where
    for pk in after.keys() - before.keys():
        new = after[pk]
        assert op.kind == "dispatch", f"job {pk} appeared after {op}"
        assert (new["state"], new["attempts"], new["reserved_by"]) == ("waiting", 0, None)


class JobLifecycle(RuleBasedStateMachine):
    """Real rows driven through the calls a worker, an operator and the code make, next to a
    model of what each call must do; the rows are compared with the model after each step."""

    def __init__(self) -> None:
        super().__init__()
        Job.objects.all().delete()
        Worker.objects.all().delete()
        self.engine: Engine = get_engine("default")
        self.now = 0  # the model clock: seconds the injected clock has moved
        self.jobs: dict[int, ModelJob] = {}
        self.issued: list[Claim] = []  # every claim handed out, current or stale
        self.heartbeats: dict[str, int | None] = {}  # worker rows: last beat (None: lapsed)
        self.frozen: set[str] = set()  # workers whose heartbeat thread stopped
        for worker in WORKERS:  # as each worker does when it starts
            self.engine.register_worker(worker, "props", 1, "[]", 1)
            self.heartbeats[worker] = self.now
        self.before: dict[int, Row] = {}
        self.op = Op("start")

    # -- helpers ---------------------------------------------------------------------------
    def is_due(self, job: ModelJob) -> bool:
        return job.state in READY and job.due_at <= self.now

    def lands(self, claim: Claim, worker: str) -> bool:
        """Whether a compare-and-set write on ``claim`` by ``worker`` matches the row."""
        return self.jobs[claim.id].current() == Claim(claim.id, claim.attempts, worker)

    def hand_out(self, worker: str, claimed: Iterable[ClaimedJob]) -> list[int]:
        ids = []
        for got in claimed:
            job = self.jobs[got.id]
            assert job.state in READY, f"claimed job {got.id} was {job.state}"
            job.state = JobState.RUNNING.value
            job.attempts += 1
            job.reserved_by = worker
            assert (got.attempts, got.queue, got.priority) == (
                job.attempts,
                job.queue,
                job.priority,
            )
            assert (got.name, got.args, got.kwargs) == (Noop.name, [], {})
            claim = Claim(got.id, got.attempts, worker)
            if claim not in self.issued:
                self.issued.append(claim)
            ids.append(got.id)
        assert len(ids) == len(set(ids)), f"one claim returned a job twice: {ids}"
        return ids

    def draw_claims(self, data: st.DataObject, max_size: int = 3) -> list[Claim]:
        """Claims a worker writes on: mostly ones it still holds, else any handed out."""
        held = [c for c in self.issued if self.jobs[c.id].current() == c]
        mostly = bool(held) and data.draw(st.integers(0, 3), label="held") > 0
        pool = held if mostly else self.issued
        return data.draw(
            st.lists(
                st.sampled_from(pool),
                min_size=1,
                max_size=max_size,
                unique_by=lambda c: c.id,
            ),
            label="claims",
        )

    def draw_ids(self, data: st.DataObject, states: Iterable[str]) -> list[int]:
        """Some jobs, mostly of the ``states`` the operation acts on."""
        wanted = sorted(j.id for j in self.jobs.values() if j.state in set(states))
        mostly = bool(wanted) and data.draw(st.integers(0, 3), label="wanted") > 0
        pool = wanted if mostly else sorted(self.jobs)
        return data.draw(
            st.lists(st.sampled_from(pool), min_size=1, max_size=4, unique=True), label="ids"
        )

    def succeed(self, worker: str, marks: list[tuple[Claim, str | None]]) -> tuple[set, set]:
        """Model the success marks; returns (ids that land, ids that must not move)."""
        landed, stale = set(), set()
        for claim, result in marks:
            if self.lands(claim, worker):
                job = self.jobs[claim.id]
                job.state = JobState.SUCCEEDED.value
                job.result = None if result is None else json.loads(result)
                landed.add(claim.id)
            else:
                stale.add(claim.id)
        return landed, stale

    def check_written(self, written: list[int], landed: set[int], sent: int) -> None:
        if self.engine.update_returning:
            assert sorted(written) == sorted(landed)
        else:  # MySQL: no RETURNING, so all the ids or none of them
            assert sorted(written) == (sorted(landed) if len(landed) == sent else [])

    # -- dispatch --------------------------------------------------------------------------
    @rule(
        queue=st.sampled_from(QUEUES),
        priority=st.sampled_from((0, 0, 5, -3)),
        when=st.sampled_from(("now", "now", *WHENS)),
        count=st.integers(1, 3),
    )
    def dispatch(self, queue: str, priority: int, when: str, count: int) -> None:
        options, offset = when_options(when)
        if count == 1:
            jobs = [Noop.dispatch(queue=queue, priority=priority, **options)]
        else:
            jobs = Noop.dispatch_many([[]] * count, queue=queue, priority=priority, **options)
        for job in jobs:
            assert job.pk not in self.jobs
            self.jobs[job.pk] = ModelJob(job.pk, queue, priority, due_at=self.now + offset)
        self.op = Op("dispatch", frozenset(j.pk for j in jobs))

    # -- claims, as the fetcher makes them ---------------------------------------------------
    @precondition(lambda self: any(j.state in READY for j in self.jobs.values()))
    @rule(
        worker=st.sampled_from(WORKERS),
        queue=st.sampled_from(QUEUES),
        limit=st.integers(1, 4),
        data=st.data(),
    )
    def claim(self, worker: str, queue: str, limit: int, data: st.DataObject) -> None:
        marks: list[tuple[Claim, str | None]] = []
        with_marks = bool(self.issued) and data.draw(st.booleans(), label="with success marks")
        if with_marks:
            marks = [
                (c, data.draw(st.sampled_from([None, f'{{"n":{c.id}}}'])))
                for c in self.draw_claims(data)
            ]
        due = [j for j in self.jobs.values() if j.queue == queue and self.is_due(j)]
        due.sort(key=lambda j: (-j.priority, self.before[j.id]["next_execution_at"], j.id))
        expected = {j.id for j in due[:limit]}

        jobs, written = self.engine.claim_and_mark(
            worker, queue, limit, [Mark(c.id, c.attempts, r) for c, r in marks]
        )

        landed, stale = self.succeed(worker, marks)
        self.check_written(written, landed, len(marks))
        claimed = self.hand_out(worker, jobs)
        assert set(claimed) == expected, (
            f"claimed {sorted(claimed)}, expected the first {limit} due of "
            f"{[j.id for j in due]} in (priority, due time, id) order"
        )
        # A stale mark's row may be claimed afresh in the same step (marks are written first).
        self.op = Op("claim", frozenset(claimed) | landed, frozenset(stale - set(claimed)))

    @precondition(lambda self: self.jobs)
    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def claim_by_id(self, worker: str, data: st.DataObject) -> None:
        """run_jobs() and GATOR_IMMEDIATE: a waiting or failed job, due or not."""
        job_id = data.draw(st.sampled_from(sorted(self.jobs)), label="job")
        claimable = self.jobs[job_id].state in READY
        got = self.engine.claim_by_id(worker, job_id)
        if claimable:
            assert got is not None
            self.hand_out(worker, [got])
        else:
            assert got is None
        self.op = Op("claim_by_id", frozenset([job_id] if claimable else []))

    # -- outcomes, compare-and-set on the claim ----------------------------------------------
    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def mark_succeeded(self, data: st.DataObject) -> None:
        claims = self.draw_claims(data)
        worker = data.draw(st.sampled_from([claims[0].owner, *WORKERS]), label="worker")
        marks = [(c, data.draw(st.sampled_from([None, f'["r",{c.id}]']))) for c in claims]
        written = self.engine.mark_succeeded(worker, [Mark(c.id, c.attempts, r) for c, r in marks])
        landed, stale = self.succeed(worker, marks)
        self.check_written(written, landed, len(marks))
        self.op = Op("succeed", frozenset(landed), frozenset(stale))

    @precondition(lambda self: self.issued)
    @rule(
        data=st.data(),
        kind=st.sampled_from(("retry", "retry", "dead", "dead", "cancelled")),
        retry_in=st.sampled_from((0.0, 500.0, 1500.0)),
        queue=st.sampled_from((None, *QUEUES)),
    )
    def mark_failed(
        self, data: st.DataObject, kind: str, retry_in: float, queue: str | None
    ) -> None:
        [claim] = self.draw_claims(data, max_size=1)
        worker = data.draw(st.sampled_from([claim.owner, claim.owner, *WORKERS]), label="worker")
        job = self.jobs[claim.id]
        error, summary = error_entry(
            ValueError(f"attempt {claim.attempts} failed"), attempt=claim.attempts, worker_id=worker
        )
        failure = Failure(
            dead=kind == "dead",
            retry_in=retry_in if kind == "retry" else None,
            queue=queue or job.queue,
            error=error,
            last_error=summary,
            cancelled=kind == "cancelled",
        )
        lands = self.lands(claim, worker)

        written = self.engine.mark_failed(worker, EngineClaim(claim.id, claim.attempts), failure)

        assert written is lands
        if lands:
            if kind == "cancelled" or job.cancel_requested:
                job.state = JobState.CANCELLED.value
            else:
                job.state = JobState.DEAD.value if kind == "dead" else JobState.FAILED.value
            if kind == "retry":
                job.due_at = self.now + int(retry_in)
            job.queue = failure.queue
            job.errors += 1
        self.op = Op(
            "fail", frozenset([claim.id] if lands else []), frozenset([] if lands else [claim.id])
        )

    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """A stopping worker hands its claims back without charging the attempt."""
        claims = self.draw_claims(data)
        worker = data.draw(st.sampled_from([claims[0].owner, *WORKERS]), label="worker")
        landed = {c.id for c in claims if self.lands(c, worker)}

        written = self.engine.release(worker, [EngineClaim(c.id, c.attempts) for c in claims])

        assert sorted(written) == sorted(landed)
        for job_id in landed:
            job = self.jobs[job_id]
            job.state = (JobState.CANCELLED if job.cancel_requested else JobState.WAITING).value
            job.attempts -= 1
        stale = {c.id for c in claims} - landed
        self.op = Op("release", frozenset(landed), frozenset(stale))

    # -- heartbeats, the injected clock and rescue --------------------------------------------
    @rule(worker=st.sampled_from(WORKERS), freezes=st.booleans())
    def heartbeat(self, worker: str, freezes: bool) -> None:
        """A worker freezes (its heartbeat is moved a day back and stops), or beats again."""
        if freezes:
            self.frozen.add(worker)
            if worker in self.heartbeats:
                self.heartbeats[worker] = None
            stale = timezone.now() - timedelta(days=1)
            Worker.objects.filter(pk=worker).update(heartbeat_at=stale)
            self.op = Op("lapse")
            return
        self.frozen.discard(worker)
        self.beat(worker)
        self.op = Op("heartbeat")

    def beat(self, worker: str) -> None:
        alive = self.engine.heartbeat(worker)
        assert alive is (worker in self.heartbeats)
        if not alive:  # as the worker does when its row was declared lost
            self.engine.register_worker(worker, "props", 1, "[]", 1)
        self.heartbeats[worker] = self.now

    @rule(ticks=st.integers(1, 2))
    def time_passes(self, ticks: int) -> None:
        delta = timedelta(seconds=ticks * TICK)
        Job.objects.update(
            next_execution_at=F("next_execution_at") - delta, locked_at=F("locked_at") - delta
        )
        Worker.objects.update(heartbeat_at=F("heartbeat_at") - delta)
        self.now += ticks * TICK
        for worker in sorted(set(self.heartbeats) - self.frozen):
            self.beat(worker)  # the workers that are not frozen kept beating meanwhile
        self.op = Op("advance")

    @precondition(lambda self: any(j.state == JobState.RUNNING for j in self.jobs.values()))
    @rule()
    def rescue(self) -> None:
        """A worker's heartbeat loop takes back the jobs of workers that stopped beating."""
        cutoff = self.now - HEARTBEAT_TIMEOUT

        def alive(worker: str | None) -> bool:
            beat = self.heartbeats.get(worker or "")
            return beat is not None and beat >= cutoff

        WorkerProcess(install_signal_handlers=False).lifeline.rescue()

        rescued = set()
        for job in self.jobs.values():
            if job.state == JobState.RUNNING and not alive(job.reserved_by):
                job.rescues += 1
                job.errors += 1
                job.due_at = self.now
                # Never dead here: only a crash while the job ran alone counts toward the
                # poison-pill limit, and this machine never isolates a job (the test of
                # crashes alone is test_a_job_whose_workers_keep_getting_lost_...).
                if job.cancel_requested:
                    job.state = JobState.CANCELLED.value
                else:
                    job.state = JobState.WAITING.value
                rescued.add(job.id)
        self.heartbeats = {w: beat for w, beat in self.heartbeats.items() if alive(w)}
        note(f"rescued {sorted(rescued)}")
        self.op = Op("rescue", frozenset(rescued))

    # -- what operators and the code do ---------------------------------------------------
    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        ids = self.draw_ids(data, (*READY, JobState.RUNNING))
        expected = set()
        for job_id in ids:
            job = self.jobs[job_id]
            if job.state in READY:
                job.state = JobState.CANCELLED.value
                expected.add(job_id)
            elif job.state == JobState.RUNNING:
                job.cancel_requested = True
                expected.add(job_id)
        assert Job.objects.filter(pk__in=ids).cancel() == len(expected)
        self.op = Op("cancel", frozenset(expected))

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), action=st.sampled_from(("retry", "retry", "discard")))
    def admin(self, data: st.DataObject, action: str) -> None:
        """The dead-job screen: retry (due now, attempts kept) or discard dead and failed jobs."""
        ids = self.draw_ids(data, (JobState.DEAD, JobState.FAILED))
        expected = set()
        for job_id in ids:
            job = self.jobs[job_id]
            if job.state in (JobState.DEAD, JobState.FAILED):
                if action == "retry":
                    job.state = JobState.WAITING.value
                    job.due_at = self.now
                    job.cancel_requested = False
                else:
                    job.state = JobState.CANCELLED.value
                expected.add(job_id)
        jobs = Job.objects.filter(pk__in=ids)
        if action == "retry":
            assert jobs.retry(by="props-admin") == len(expected)
        else:
            assert jobs.discard(by="props-admin") == len(expected)
        for row in Job.objects.filter(pk__in=expected):
            assert row.audit is not None
            assert row.audit[-1]["action"] == action
            assert row.audit[-1]["by"] == "props-admin"
        self.op = Op(action, frozenset(expected))

    # -- after every step --------------------------------------------------------------------
    @invariant()
    def rows_are_valid_moved_legally_and_match_the_model(self) -> None:
        after = snapshot()
        check_rows(after)
        check_move(self.before, after, self.op)
        assert set(after) == set(self.jobs)
        for pk, job in self.jobs.items():
            row = after[pk]
            got = (
                row["state"],
                row["attempts"],
                row["reserved_by"],
                row["rescues"],
                len(row["errors"] or []),
                row["cancel_requested"],
                row["queue"],
                row["priority"],
            )
            want = (
                job.state,
                job.attempts,
                job.reserved_by,
                job.rescues,
                job.errors,
                job.cancel_requested,
                job.queue,
                job.priority,
            )
            assert got == want, f"job {pk} after {self.op}: row {row}, model {job}"
            if job.state == JobState.SUCCEEDED:
                assert row["result"] == job.result
        # Due and scheduled, by database time against the injected clock.
        ready = set(Job.objects.ready().values_list("pk", flat=True))
        scheduled = set(Job.objects.scheduled().values_list("pk", flat=True))
        assert ready == {j.id for j in self.jobs.values() if self.is_due(j)}
        assert scheduled == {
            j.id for j in self.jobs.values() if j.state in READY and j.due_at > self.now
        }
        assert set(Worker.objects.values_list("pk", flat=True)) == set(self.heartbeats)
        self.before = after


@pytest.mark.django_db(transaction=True)
def test_the_job_lifecycle_holds_its_invariants_against_the_database(settings: Any) -> None:
    settings.GATOR_HEARTBEAT_TIMEOUT = HEARTBEAT_TIMEOUT
    settings.GATOR_MAX_RESCUES = MAX_RESCUES
    run_state_machine_as_test(
        JobLifecycle,
        settings=hsettings(
            max_examples=50,
            stateful_step_count=30,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def fresh_tables() -> None:
    Job.objects.all().delete()
    Worker.objects.all().delete()


def a_failure(attempt: int, worker: str, **options: Any) -> Failure:
    error, summary = error_entry(ValueError("boom"), attempt=attempt, worker_id=worker)
    return Failure(
        **{"dead": False, "retry_in": 0.0, "queue": "default", **options},
        error=error,
        last_error=summary,
    )


@pytest.mark.django_db(transaction=True)
@hsettings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    history=st.lists(
        st.tuples(st.sampled_from(WORKERS), st.sampled_from(("retry", "release", "rescue"))),
        min_size=1,
        max_size=4,
    ),
    holder=st.sampled_from(WORKERS),
)
def test_a_write_with_a_stale_or_forged_claim_changes_nothing(
    settings: Any, history: list[tuple[str, str]], holder: str
) -> None:
    """A job goes through claims that end in a retry, a release or a rescue, then is held by
    ``holder``: no success, failure or release written with any other claim (an earlier one,
    or the current attempt under another name, or another attempt under the holder's name)
    changes the row, and the holder's own write still lands."""
    settings.GATOR_MAX_RESCUES = 100
    fresh_tables()
    engine = get_engine("default")
    job_id = Noop.dispatch().pk
    claims = []
    for worker, end in history:
        got = engine.claim_by_id(worker, job_id)
        assert got is not None
        claims.append(Claim(job_id, got.attempts, worker))
        if end == "retry":
            assert engine.mark_failed(
                worker, EngineClaim(job_id, got.attempts), a_failure(got.attempts, worker)
            )
        elif end == "release":
            assert engine.release(worker, [EngineClaim(job_id, got.attempts)]) == [job_id]
        else:  # its worker never beat: lost
            WorkerProcess(install_signal_handlers=False).lifeline.rescue()
    got = engine.claim_by_id(holder, job_id)
    assert got is not None
    held = Claim(job_id, got.attempts, holder)
    forged = [
        *(Claim(job_id, held.attempts, w) for w in WORKERS if w != holder),
        Claim(job_id, held.attempts + 1, holder),
        Claim(job_id, held.attempts - 1, holder),
    ]
    others = [c for c in {*claims, *forged} if c != held]
    before = snapshot()

    for claim in others:
        assert engine.mark_succeeded(claim.owner, [Mark(job_id, claim.attempts, '"late"')]) == []
        failure = a_failure(claim.attempts, claim.owner, dead=True, retry_in=None)
        assert (
            engine.mark_failed(claim.owner, EngineClaim(job_id, claim.attempts), failure) is False
        )
        assert engine.release(claim.owner, [EngineClaim(job_id, claim.attempts)]) == []
        assert engine.claim_state(job_id) == ("running", held.attempts, holder)

    assert snapshot() == before
    assert engine.mark_succeeded(holder, [Mark(job_id, held.attempts, None)]) == [job_id]
    assert Job.objects.get(pk=job_id).state == JobState.SUCCEEDED


@pytest.mark.django_db(transaction=True)
@hsettings(
    max_examples=20,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    rounds=st.lists(st.tuples(st.sampled_from(WORKERS), st.booleans()), min_size=1, max_size=5),
    cancel_in=st.one_of(st.none(), st.integers(0, 3)),
    max_rescues=st.integers(1, 3),
)
def test_a_job_whose_workers_keep_getting_lost_goes_dead_after_max_crashes_alone(
    settings: Any, rounds: list[tuple[str, bool]], cancel_in: int | None, max_rescues: int
) -> None:
    """Each rescue charges the lost attempt and records it, and makes the job a suspect;
    only a worker lost while the job ran alone counts as a crash it caused, and the
    MAX_RESCUES-th such crash makes it dead (a poison pill). A job asked to cancel ends
    cancelled instead."""
    settings.GATOR_MAX_RESCUES = max_rescues
    fresh_tables()
    engine = get_engine("default")
    job_id = Noop.dispatch().pk
    crashes = 0
    for round_, (owner, alone) in enumerate(rounds):
        got = engine.claim_by_id(owner, job_id)
        if round_ and Job.objects.get(pk=job_id).state != JobState.RUNNING:
            assert got is None
            break
        assert got is not None
        assert got.attempts == round_ + 1
        assert got.suspect is (round_ > 0)
        if alone:
            assert engine.isolate(owner, job_id, got.attempts)
        if cancel_in == round_:
            assert Job.objects.filter(pk=job_id).cancel() == 1
        WorkerProcess(install_signal_handlers=False).lifeline.rescue()

        crashes += alone
        row = Job.objects.get(pk=job_id)
        if cancel_in is not None and cancel_in <= round_:
            state = JobState.CANCELLED
        elif alone and crashes >= max_rescues:
            state = JobState.DEAD
        else:
            state = JobState.WAITING
        assert (row.state, row.attempts, row.rescues) == (state, round_ + 1, round_ + 1)
        assert (row.crashes, row.suspect, row.isolated) == (crashes, True, False)
        assert [e["attempt"] for e in row.errors or []] == list(range(1, round_ + 2))
        assert row.error_class == "django_gator.exceptions.WorkerLost"
        assert (row.finished_at is None) is (state == JobState.WAITING)
        assert f"worker {owner} stopped heartbeating" in row.last_error
        assert ("ran alone in it" in row.last_error) is alone


# -- 2. what dispatch accepts and stores ------------------------------------------------------


def dispatch_outcome(args: list[Any], kwargs: dict[str, Any]) -> tuple[Job | None, str | None]:
    """(the stored row, None) or (None, the TypeError's message); nothing else may happen."""
    try:
        with transaction.atomic():
            [job] = enqueue(Noop, [(args, kwargs)])
    except TypeError as exc:
        return None, str(exc)
    return Job.objects.get(pk=job.pk), None


@pytest.mark.django_db
@hsettings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    args=st.lists(validation_tests.mixed_values, max_size=3),
    kwargs=st.dictionaries(validation_tests.clean_text, validation_tests.mixed_values, max_size=3),
)
def test_dispatch_accepts_exactly_what_round_trips_and_stores_it_unchanged(
    args: list[Any], kwargs: dict[str, Any]
) -> None:
    expected = validation_tests.round_trips_identically(
        args
    ) and validation_tests.round_trips_identically(kwargs)
    count = Job.objects.count()

    row, refusal = dispatch_outcome(args, kwargs)

    if expected:
        assert refusal is None, f"refused arguments that round-trip: {refusal}"
        assert row is not None
        assert validation_tests._same(row.args, args), (row.args, args)
        assert validation_tests._same(row.kwargs, kwargs), (row.kwargs, kwargs)
    else:
        assert refusal is not None, "accepted arguments that do not round-trip"
        assert refusal.startswith(("args", "kwargs")), refusal
        assert Job.objects.count() == count


@st.composite
def many_items(draw: Any) -> list[Any]:
    """dispatch_many() items: flat lists and dicts of JSON atoms, with up to three odd ones
    (a bad atom among good ones, or nested values of any kind) put in anywhere."""
    atoms = validation_tests.json_atoms
    items: list[Any] = draw(
        st.lists(
            st.one_of(
                st.lists(atoms, max_size=3),
                st.dictionaries(validation_tests.clean_text, atoms, max_size=2),
            ),
            max_size=20,
        )
    )
    # Atoms at the edges of what the column checks clear at once, good and bad.
    edges = st.sampled_from(
        ["\ud800", "a\x00b", "\\u0000", "e+", 1e16, -1e16, 9.9e15, -2.5e300, 2**64, 2**14001]
    )
    odd = st.one_of(
        st.lists(st.one_of(atoms, edges), min_size=1, max_size=3),
        st.dictionaries(validation_tests.clean_text, edges, min_size=1, max_size=2),
        st.lists(st.one_of(atoms, validation_tests.bad_atoms), min_size=1, max_size=3),
        st.lists(validation_tests.mixed_values, max_size=2),
    )
    for _ in range(draw(st.integers(1 if not items else 0, 3))):
        items.insert(draw(st.integers(0, len(items))), draw(odd))
    return items


@pytest.mark.django_db
@hsettings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(items=many_items())
def test_dispatch_many_refuses_the_first_item_a_dispatch_would_refuse_and_stores_the_rest(
    items: list[Any],
) -> None:
    """dispatch_many checks its items a column at a time: it must accept exactly what one
    dispatch() per item would, name the first item that one would refuse, and store the
    same values."""
    first_bad = next(
        (
            index
            for index, item in enumerate(items)
            if not validation_tests.round_trips_identically(item)
        ),
        None,
    )
    count = Job.objects.count()
    if first_bad is not None:
        with pytest.raises(TypeError) as refusal, transaction.atomic():
            Noop.dispatch_many(items)
        assert str(refusal.value).startswith(f"dispatch_many() item {first_bad}: "), refusal
        assert Job.objects.count() == count
        return
    with transaction.atomic():
        jobs = Noop.dispatch_many(items)
    for job, item in zip(jobs, items, strict=True):
        row = Job.objects.get(pk=job.pk)
        args, kwargs = ([], item) if isinstance(item, dict) else (item, {})
        assert validation_tests._same(row.args, args), (row.args, args)
        assert validation_tests._same(row.kwargs, kwargs), (row.kwargs, kwargs)


@st.composite
def nested(draw: Any) -> Any:
    """A value nested 0 to 110 lists or dicts deep around one JSON atom."""
    value: Any = draw(st.sampled_from([1, "x", None, 2.5, [], {}]))
    for _ in range(draw(st.integers(0, 110), label="depth")):
        value = [value] if draw(st.booleans()) else {"k": value}
    return value


@pytest.mark.django_db
@hsettings(
    max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(value=nested())
def test_dispatch_stores_every_nesting_depth_that_validation_accepts(value: Any) -> None:
    try:
        check_json([value], "args")
        accepted = True
    except TypeError:
        accepted = False

    row, refusal = dispatch_outcome([value], {})

    assert (refusal is None) is accepted, refusal
    if accepted:
        assert row is not None
        assert row.args == [value]


# -- 3. queue specs and their weighted order ---------------------------------------------------

queue_names = st.from_regex(QUEUE_RE, fullmatch=True).filter(lambda n: len(n) <= QUEUE_MAX_LENGTH)
weights = st.integers(1, MAX_WEIGHT)
spaces = st.sampled_from(["", " ", "  ", "\t"])


def refused(message: str) -> Any:
    """pytest.raises() for the ValueError with exactly ``message``."""
    return pytest.raises(ValueError, match=f"^{re.escape(message)}$")


@st.composite
def spec_lists(draw: Any) -> list[QueueSpec]:
    names = draw(st.lists(queue_names, min_size=1, max_size=6, unique=True))
    return [QueueSpec(name, draw(weights)) for name in names]


def spec_text(draw: Callable[..., Any], spec: QueueSpec) -> str:
    """``spec`` as a ``-q`` value: NAME alone for weight 1 sometimes, spaces around parts."""
    name = f"{draw(spaces)}{spec.name}{draw(spaces)}"
    if spec.weight == 1 and draw(st.booleans()):
        return name
    return f"{name},{draw(spaces)}{spec.weight}{draw(spaces)}"


@pure
@given(specs=spec_lists(), data=st.data())
def test_queue_specs_format_and_parse_back_to_the_same_specs(
    specs: list[QueueSpec], data: st.DataObject
) -> None:
    texts = [spec_text(data.draw, spec) for spec in specs]

    assert parse_queue_specs(texts) == specs
    assert [parse_queue_spec(text) for text in texts] == specs


@pure
@given(
    name=queue_names,
    weight=st.one_of(st.integers(max_value=0), st.integers(min_value=MAX_WEIGHT + 1)),
)
def test_a_weight_out_of_range_is_refused_naming_it(name: str, weight: int) -> None:
    text = f"{name},{weight}"
    with refused(f"queue weight {weight} in {text!r} must be from 1 to {MAX_WEIGHT}"):
        parse_queue_specs([text])


#: Weights that are no whole number in any spelling.
not_numbers = st.one_of(
    st.just(""),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.decimals(places=2, allow_nan=False).map(str).filter(lambda t: "." in t),
    st.text(st.characters(categories=("L", "P", "S")), min_size=1, max_size=6),
    st.builds(lambda n, tail: f"{n}{tail}", weights, st.sampled_from(["x", ".0", "e2", ",1", "%"])),
)


@pure
@given(name=queue_names, weight_text=not_numbers)
def test_a_weight_that_is_no_whole_number_is_refused_naming_it(name: str, weight_text: str) -> None:
    text = f"{name},{weight_text}"
    with refused(f"queue weight {weight_text.strip()!r} in {text!r} is not a whole number"):
        parse_queue_specs([text])


@pure
@given(
    name=queue_names,
    weight_text=st.one_of(
        st.builds(lambda a, b: f"{a}_{b}", st.integers(1, 9), st.integers(0, 9)),
        st.sampled_from(["٣", "३", "\uff11\uff12", "+5", " +7", "2_000"]),
    ),
)
def test_a_weight_is_written_in_plain_decimal_digits(name: str, weight_text: str) -> None:
    """int() would take these spellings; a weight is plain ASCII digits."""
    with pytest.raises(ValueError, match=re.escape(repr(weight_text.strip()))):
        parse_queue_specs([f"{name},{weight_text}"])


@pure
@given(
    weight=st.one_of(st.just(""), weights.map(str)),
    blank=spaces,
)
def test_a_spec_without_a_name_is_refused(weight: str, blank: str) -> None:
    text = f"{blank},{weight}" if weight else blank
    with refused(f"queue spec {text!r} has no queue name; use NAME or NAME,WEIGHT"):
        parse_queue_specs(["default", text])


@pure
@given(name=st.text(min_size=1, max_size=120).filter(lambda n: "," not in n and n.strip()))
def test_a_name_that_no_queue_can_have_is_refused_naming_it(name: str) -> None:
    valid = QUEUE_RE.fullmatch(name.strip()) and len(name.strip()) <= QUEUE_MAX_LENGTH
    if valid:
        assert parse_queue_specs([name]) == [QueueSpec(name.strip())]
        return
    with refused(f"invalid queue name {name.strip()!r} in {f'{name},2'!r}"):
        parse_queue_specs([f"{name},2"])


@pure
@given(specs=spec_lists(), data=st.data())
def test_a_queue_listed_twice_is_refused_naming_it(
    specs: list[QueueSpec], data: st.DataObject
) -> None:
    twice = data.draw(st.sampled_from(specs))
    again = QueueSpec(twice.name, data.draw(weights))
    texts = [spec_text(data.draw, s) for s in specs]
    texts.insert(data.draw(st.integers(0, len(texts))), spec_text(data.draw, again))
    with refused(f"queue {twice.name!r} is listed twice"):
        parse_queue_specs(texts)


@pure
@given(specs=spec_lists(), seed=st.integers(0, 2**32))
def test_the_weighted_order_is_always_a_permutation_of_the_queues(
    specs: list[QueueSpec], seed: int
) -> None:
    rng = random.Random(seed)
    names = sorted(s.name for s in specs)
    for _ in range(20):
        assert sorted(weighted_order(specs, rng)) == names
    # The same seed gives the same orders.
    assert [weighted_order(specs, random.Random(seed)) for _ in range(3)] == [
        weighted_order(specs, random.Random(seed))
    ] * 3


class ExtremeRandom(random.Random):
    """random() returns only the ends of its range, 0.0 and just under 1.0."""

    def random(self) -> float:
        return 0.0 if super().random() < 0.5 else 1.0 - 2**-53


@pure
@given(specs=spec_lists(), seed=st.integers(0, 2**32))
def test_the_weighted_order_is_a_permutation_at_the_ends_of_random(
    specs: list[QueueSpec], seed: int
) -> None:
    order = weighted_order(specs, ExtremeRandom(seed))
    assert sorted(order) == sorted(s.name for s in specs)


@hsettings(
    max_examples=15, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(a=weights, b=weights, seed=st.integers(0, 2**32))
def test_the_first_queue_is_picked_in_proportion_to_its_weight(a: int, b: int, seed: int) -> None:
    """Efraimidis-Spirakis with two queues: P(first) = weight / total."""
    rng = random.Random(seed)
    specs = [QueueSpec("a", a), QueueSpec("b", b)]
    draws = 3000
    firsts = sum(weighted_order(specs, rng)[0] == "a" for _ in range(draws))
    # Five standard deviations of a binomial at p = 1/2 (the widest): about 0.046.
    assert firsts / draws == pytest.approx(a / (a + b), abs=0.046)
