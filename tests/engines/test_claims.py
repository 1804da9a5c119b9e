"""Keyset claims (PostgreSQL): each claim reads every priority of a queue from the last job
the worker claimed there, so its cost does not grow with the dead index entries that a long
transaction keeps behind that position; higher priorities, late commits and back-dated
jobs are still claimed within the bounds that worker/claims.py documents."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_gator.attempts import Mark
from django_gator.engines import get_engine
from django_gator.engines.base import Position
from django_gator.models import Job, JobState
from django_gator.worker.claims import (
    COST_SAMPLES,
    FULL_CLAIM_EVERY,
    KEYSET_LOOKBACK,
    KEYSET_SAMPLES,
    QUEUE_LIST_RECHECK,
    QUEUE_LIST_TTL,
    Claimer,
)
from django_gator.worker.queues import QueueSpec
from tests.conftest import wait_for, worker_output
from tests.testapp.jobs import Noop, Record

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        "connection.vendor != 'postgresql'", reason="keyset claims are PostgreSQL's"
    ),
]


class Clock:
    """A monotonic clock the test moves by hand (the database is real)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def long_transaction() -> Iterator[None]:
    """A REPEATABLE READ transaction on its own connection, open for the whole test: no
    dead row or index entry of the jobs table can be cleaned up meanwhile."""
    settings = connection.settings_dict
    held = psycopg.connect(
        dbname=settings["NAME"],
        user=settings["USER"],
        password=settings["PASSWORD"] or None,
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
    )
    held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    held.execute("SELECT count(*) FROM django_gator_job").fetchone()
    try:
        yield
    finally:
        held.close()


def _buffers(sql: str, params: Any, cte: str | None = None) -> int:
    """Shared buffers the statement reads, from EXPLAIN (ANALYZE, BUFFERS), rolled back;
    with ``cte``, those of that CTE of the statement only (a claim's ``picked``: its read
    of the ready index, not the UPDATE, whose join plan follows the table's statistics)."""
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("ROLLBACK")
    start = 0 if cte is None else plan.index(f"CTE {cte}\n")
    found = re.compile(r"Buffers: shared hit=(\d+)(?: read=(\d+))?").search(plan, start)
    assert found, plan
    return int(found.group(1)) + int(found.group(2) or 0)


def test_a_claimer_finds_higher_priority_and_back_dated_jobs_within_its_bounds():
    engine = get_engine("default")
    clock = Clock()
    claimer = Claimer(engine, "w", [QueueSpec("default")], clock=clock, keyset=True)
    Noop.dispatch_many([[i] for i in range(4)])
    assert len(claimer.claim(2)[0]) == 2  # the first claim is a full one
    clock.now += 1
    assert claimer.position("default") is not None  # from now on, keyset claims

    urgent = Noop.dispatch("urgent", priority=50)
    [claimed], _ = claimer.claim(1)
    assert claimed.id == urgent.pk  # at once: the next claim

    back_dated = Noop.dispatch("back-dated", at=timezone.now() - timedelta(hours=1))
    seen = [j.id for j in claimer.claim(1)[0]]
    assert back_dated.pk not in seen  # placed before the position: not yet
    clock.now += FULL_CLAIM_EVERY + 0.1
    assert claimer.position("default") is None  # the full claim is due
    [claimed], _ = claimer.claim(1)
    assert claimed.id == back_dated.pk  # within FULL_CLAIM_EVERY
    clock.now += 1
    assert claimer.position("default") is not None
    [rest], _ = claimer.claim(5)
    assert rest.args == [3]  # the backlog goes on where it stopped
    assert claimer.claim(5) == ([], [])
    assert KEYSET_LOOKBACK < FULL_CLAIM_EVERY


def test_a_full_batch_of_back_dated_jobs_is_drained_from_where_it_stopped():
    engine = get_engine("default")
    clock = Clock()
    claimer = Claimer(engine, "w", [QueueSpec("default")], clock=clock, keyset=True)
    Noop.dispatch("first")
    assert len(claimer.claim(1)[0]) == 1
    hour_ago = timezone.now() - timedelta(hours=1)
    late = [Noop.dispatch(i, at=hour_ago + timedelta(seconds=i)) for i in range(5)]
    clock.now += FULL_CLAIM_EVERY + 0.1
    assert {j.id for j in claimer.claim(2)[0]} == {late[0].pk, late[1].pk}  # full claim
    clock.now += 0.1
    # Keyset claims go on from the last back-dated job claimed, not from the old position.
    assert {j.id for j in claimer.claim(5)[0]} == {j.pk for j in late[2:]}


class Timer:
    """Durations chosen by the test: each claim "takes" what ``costs`` says for its kind."""

    def __init__(self, claimer: Claimer, costs: dict[bool, float]) -> None:
        self.claimer, self.costs, self.now, self.started = claimer, costs, 0.0, False

    def __call__(self) -> float:
        if self.started:  # the end of a claim: advance by its kind's cost
            self.now += self.costs[self.kind]
        else:
            self.kind = self.claimer.position("default") is not None
        self.started = not self.started
        return self.now


def test_a_claimer_uses_keyset_claims_only_while_they_are_cheaper():
    engine = get_engine("default")
    clock = Clock()
    claimer = Claimer(engine, "w", [QueueSpec("default")], clock=clock)
    costs = {False: 0.0005, True: 0.0008}  # a clean index: the full claim is cheaper
    claimer.timer = Timer(claimer, costs)
    Noop.dispatch_many([[i] for i in range(20)])

    kinds = []
    for _ in range(6):
        kinds.append(claimer.position("default") is not None)
        assert len(claimer.claim(1)[0]) == 1
    # The first claim is a full one; then keyset claims until KEYSET_SAMPLES are measured.
    assert kinds == [False, True, True, True, False, False]
    assert KEYSET_SAMPLES == 3

    # Dead entries pile up (a long transaction): full claims get slower.
    costs[False] = 0.004
    for _ in range(8):
        kinds.append(claimer.position("default") is not None)
        assert len(claimer.claim(1)[0]) == 1
    # Keyset claims once every full claim kept (the newest COST_SAMPLES) is past the margin.
    assert COST_SAMPLES == 5
    assert kinds[6:] == [False] * 5 + [True] * 3
    clock.now += FULL_CLAIM_EVERY + 0.1
    assert claimer.position("default") is None  # a full claim is still due in time


def test_a_claimer_is_not_kept_on_full_claims_by_one_slow_keyset_claim():
    # A busy worker's fetcher waits for the GIL after its statements: some claims "take"
    # far longer than the statement did. One such keyset claim must not put the worker
    # back on full claims that step over the dead entries of a long transaction.
    engine = get_engine("default")
    clock = Clock()
    claimer = Claimer(engine, "w", [QueueSpec("default")], clock=clock)
    costs = {False: 0.004, True: 0.0008}
    claimer.timer = Timer(claimer, costs)
    Noop.dispatch_many([[i] for i in range(40)])
    kinds = []
    for slow in [False] * 6 + [True] + [False] * 6:
        costs[True] = 0.050 if slow else 0.0008  # the GIL held for 50 ms once
        kinds.append(claimer.position("default") is not None)
        assert len(claimer.claim(1)[0]) == 1
        clock.now += 0.5
    assert kinds == [False] + [True] * 12


def test_a_keyset_claim_measured_slow_once_is_measured_again():
    # The first keyset claim of a queue plans its statement and can take longer than a
    # full claim; dead entries then pile up in front of the full claims. Before, the
    # stale figure was never refreshed, and the worker made full claims for ever.
    engine = get_engine("default")
    clock = Clock()
    claimer = Claimer(engine, "w", [QueueSpec("default")], clock=clock)
    costs = {False: 0.004, True: 0.030}
    claimer.timer = Timer(claimer, costs)
    Noop.dispatch_many([[i] for i in range(20)])

    kinds = []
    for _ in range(4):
        kinds.append(claimer.position("default") is not None)
        assert len(claimer.claim(1)[0]) == 1
    assert kinds == [False, True, True, True]
    assert claimer.position("default") is None  # the keyset claims measured slow
    costs[True] = 0.0008  # its real cost
    clock.now += FULL_CLAIM_EVERY + 0.1
    for _ in range(6):
        kinds.append(claimer.position("default") is not None)
        assert len(claimer.claim(1)[0]) == 1
    # A full claim is due first, then the stale keyset figures are measured again, and
    # keyset claims pay from then on.
    assert kinds[4:] == [False] + [True] * 5


def test_all_queues_mode_claims_known_queues_and_finds_new_ones():
    engine = get_engine("default")
    clock = Clock()
    claimer = Claimer(engine, "w", clock=clock)
    Noop.dispatch("a")
    assert len(claimer.claim(4)[0]) == 1
    assert claimer.queue_order() == ["default"]  # known, though empty now
    assert engine.ready_queues(["default"]) == []
    other = Noop.dispatch("b", queue="other")
    # The list of queues is trusted for QUEUE_LIST_TTL, or after a round that finds
    # nothing, QUEUE_LIST_RECHECK after it was read.
    assert claimer.claim(4) == ([], [])
    assert claimer.claim(4) == ([], [])
    clock.now += QUEUE_LIST_RECHECK
    [claimed], _ = claimer.claim(4)
    assert claimed.id == other.pk
    Noop.dispatch("c", queue="zeta")
    Noop.dispatch("d", queue="alpha")
    assert engine.ready_queues(["default", "other"]) == ["alpha", "zeta"]
    assert engine.ready_queues() == ["alpha", "zeta"]


def test_all_queues_mode_searches_for_new_queues_at_most_twice_a_second(monkeypatch):
    # The search lists only queues not known yet: busy on a known queue, the usual answer
    # is empty. It was never kept, and a round that found nothing asked for a search at the
    # next one, so a busy worker searched at almost every round (one of its dearest
    # statements to plan: about 1 ms on partitioned storage, 0.7 ms on a plain table).
    engine = get_engine("default")
    clock = Clock()
    claimer = Claimer(engine, "w", clock=clock)
    searches: list[list[str]] = []
    search = engine.ready_queues

    def counted(known: Any = ()) -> list[str]:
        searches.append(list(known))
        return search(known)

    monkeypatch.setattr(engine, "ready_queues", counted)
    Noop.dispatch_many([[i] for i in range(10)])
    assert len(claimer.claim(1)[0]) == 1
    known = ["default"] if engine.supports_keyset else []
    for _ in range(2):
        clock.now += QUEUE_LIST_TTL + 0.1
        for _ in range(3):
            assert len(claimer.claim(1)[0]) == 1
    assert searches == [[], known, known]  # once a TTL, whatever the answer
    other = Noop.dispatch("b", queue="other")
    assert len(claimer.claim(1)[0]) == 1  # from "default": the answer is kept until the TTL
    assert len(searches) == 3
    clock.now += QUEUE_LIST_TTL + 0.1
    claimed = [job.id for job in claimer.claim(10)[0]]
    assert searches[3:] == [known]
    assert other.pk in claimed
    assert len(claimed) == 3  # the two left in "default" and the new queue's
    # Rounds that find nothing look again, but not sooner than QUEUE_LIST_RECHECK after
    # the last look (here the round above): a busy worker makes many such rounds.
    before = len(searches)
    for _ in range(5):
        assert claimer.claim(10) == ([], [])
    assert len(searches) == before
    clock.now += QUEUE_LIST_RECHECK
    for _ in range(5):
        assert claimer.claim(10) == ([], [])
    assert len(searches) == before + 1


def test_keyset_claims_and_queue_search_do_not_step_over_dead_entries(long_transaction):
    """With a long transaction open, every claimed job leaves a dead entry at the start of
    the ready index. What a full claim and a plain queue search read grows with them; what
    a keyset claim and a queue search that skips the known queue read does not."""
    engine = get_engine("default")
    position: dict[int, Any] = {}

    def run(count: int) -> None:
        # Due an hour ago: the keyset claim's lookback (1 s) does not reach back to them.
        Noop.dispatch_many([[i] for i in range(count)], at=timezone.now() - timedelta(hours=1))
        while jobs := engine.claim("w", "default", 100, after=Position(position)):
            engine.mark_succeeded("w", [Mark(j.id, j.attempts, None) for j in jobs])
            position[0] = (jobs[-1].next_execution_at, jobs[-1].id)

    def statement(call: Any) -> tuple[str, Any]:
        with CaptureQueriesContext(connection) as queries:
            call()
        return queries.captured_queries[-1]["sql"], None

    def read() -> dict[str, int]:
        Noop.dispatch("new")  # one due job after the position
        after = Position(position, KEYSET_LOOKBACK)
        # The claims' read of the ready index (their UPDATE's plan is not the point here).
        return {
            "full claim": _buffers(
                *statement(lambda: engine.claim("p", "default", 1)), cte="picked"
            ),
            "keyset claim": _buffers(
                *statement(lambda: engine.claim("p", "default", 1, after=after)), cte="picked"
            ),
            "queue search": _buffers(*statement(engine.ready_queues)),
            "skipping search": _buffers(*statement(lambda: engine.ready_queues(["default"]))),
        }

    run(500)
    before = read()
    run(2500)
    after = read()
    for bounded in ("keyset claim", "skipping search"):
        assert after[bounded] <= before[bounded] + 1, (bounded, before, after)
    for growing in ("full claim", "queue search"):
        assert after[growing] >= 3 * before[growing], (growing, before, after)


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
