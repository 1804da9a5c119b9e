"""Flow control: queue concurrency and rate limits, per-key limits of job classes, their
claim on every engine, settings and bad input. The proof with real worker processes is in
tests/reliability/test_flow_workers.py."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import checks
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_gator import Queueable
from django_gator.attempts import Mark
from django_gator.engines import get_engine
from django_gator.engines.flow import ClassLimits, FlowClaims
from django_gator.limits import Rate, parse_rate, validate_concurrency
from django_gator.models import FlowStart, Job, JobState, Queue
from django_gator.worker.claims import Claimer
from django_gator.worker.flow import FlowRouter, class_limits
from django_gator.worker.queues import QueueSpec, parse_queue_specs
from django_gator.worker.supervisor import WorkerProcess
from tests.admin_helpers import operator
from tests.conftest import run_worker, start_worker_thread, wait_for, waiting_on_locks
from tests.factories import JobFactory, WorkerFactory
from tests.testapp.jobs import KeyedSpan, Noop, OneAtATime, RatedSpan, Span, sync_user

pytestmark = pytest.mark.django_db(transaction=True)


def limits_of(name: str) -> ClassLimits | None:
    return class_limits(name)


def claim(queue: str, limit: int, worker: str = "w1") -> list[int]:
    engine = get_engine("default")
    jobs, _ = FlowClaims(engine).claim(worker, queue, limit, limits_of)
    return sorted(j.id for j in jobs)


def finish(ids: list[int]) -> None:
    Job.objects.filter(pk__in=ids).update(state=JobState.SUCCEEDED)


# -- values ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "rate"),
    [("100/m", Rate(100, 60)), ("5/s", Rate(5, 1)), (" 7 / h ", Rate(7, 3600)), ("", None)],
)
def test_rates_parse(text, rate):
    assert parse_rate(text) == rate
    if rate is not None:
        assert parse_rate(str(rate)) == rate


@pytest.mark.parametrize("bad", ["100 per minute", "0/s", "10/d", "-1/s", "/s", 10, "1.5/s"])
def test_a_bad_rate_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="rate_limit") as caught:
        parse_rate(bad)
    assert repr(bad) in str(caught.value)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "5"])
def test_a_bad_concurrency_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="concurrency") as caught:
        validate_concurrency(bad)
    assert repr(bad) in str(caught.value)


def test_job_classes_refuse_bad_limits_naming_them():
    with pytest.raises(ValueError, match=r"Bad\.concurrency_limit .* got 0"):

        class Bad(Queueable):
            concurrency_limit = 0

            def handle(self) -> None: ...

    with pytest.raises(ValueError, match=r"Worse\.rate_limit .*'100 per minute'"):

        class Worse(Queueable):
            rate_limit = "100 per minute"

            def handle(self) -> None: ...

    with pytest.raises(TypeError, match=r"concurrency_key\(\) but neither"):

        class Keyless(Queueable):
            def concurrency_key(self) -> str:
                return "k"

            def handle(self) -> None: ...


def test_dispatch_stores_the_key_computed_from_the_arguments():
    keyed = KeyedSpan.dispatch("/dev/null", "42", seconds=0)
    whole = OneAtATime.dispatch("/dev/null", "x", 0)
    plain = Noop.dispatch()
    function = sync_user.dispatch(7)
    rows = dict(Job.objects.values_list("pk", "concurrency_key"))
    assert rows == {keyed.pk: "account:42", whole.pk: "", plain.pk: None, function.pk: "user:7"}
    assert keyed.concurrency_key == "account:42"


def test_workflow_and_chain_steps_carry_their_keys_when_released():
    from django_gator import Chain, Workflow
    from django_gator.testing import run_jobs

    chain_first = Chain(sync_user, sync_user).dispatch(5)
    wf = Workflow("keys")
    first = wf.add(KeyedSpan, "/dev/null", "7", 0)
    wf.add(sync_user, 8, after=[first])
    wf.add(Noop, after=[first])
    wf.dispatch()
    assert Job.objects.get(pk=chain_first.pk).concurrency_key == "user:5"
    assert first.job is not None
    assert first.job.concurrency_key == "account:7"

    run_jobs()  # the first steps succeed; their successors are inserted then

    keys = sorted(
        (name.rsplit(".", 1)[-1], key)
        for name, key in Job.objects.values_list("name", "concurrency_key")
    )
    assert keys == [
        ("KeyedSpan", "account:7"),
        ("Noop", None),
        ("sync_user", "user:5"),
        ("sync_user", "user:5"),
        ("sync_user", "user:8"),
    ]
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.SUCCEEDED}


def test_a_bad_key_is_refused_at_dispatch_naming_it():
    class BadKey(Queueable):
        concurrency_limit = 1

        def concurrency_key(self, n: int) -> Any:
            return n

        def handle(self, n: int) -> None: ...

    with pytest.raises(TypeError, match=r"concurrency_key\(\) must return a str or None, got 5"):
        BadKey.dispatch(5)
    with pytest.raises(ValueError, match=r"dispatch_many\(\) item 1: .*concurrency_key"):
        sync_user.dispatch_many([[1], ["x" * 300]])
    assert not Job.objects.exists()


# -- the ordinary claim leaves limited rows alone -------------------------------------------
def test_the_ordinary_claim_takes_neither_keyed_rows_nor_a_limited_queue():
    engine = get_engine("default")
    keyed = [KeyedSpan.dispatch("/dev/null", "1", 0, queue="mixed") for _ in range(3)]
    plain = [Noop.dispatch(queue="mixed") for _ in range(2)]
    assert sorted(j.id for j in engine.claim("w1", "mixed", 10)) == [j.pk for j in plain]
    assert engine.ready_queues() == []  # only keyed rows are left
    assert FlowClaims(engine).keyed_queues() == {"mixed"}
    # Two of the key's three: its limit.
    assert claim("mixed", 10) == [j.pk for j in keyed[:2]]

    Queue.objects.set_limits("spans", concurrency=3, rate_limit=None, by="ops")
    spans = [Span.dispatch("/dev/null", "s", 0) for _ in range(5)]
    assert engine.claim("w1", "spans", 10) == []
    assert claim("spans", 10) == [j.pk for j in spans[:3]]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL plans")
def test_postgres_claims_use_their_own_partial_indexes():
    KeyedSpan.dispatch_many([["/dev/null", str(i), 0] for i in range(50)])
    Noop.dispatch_many([[] for _ in range(50)], queue="keyed")
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        for extra, index in (
            ("IS NULL", "gator_job_ready "),
            ("IS NOT NULL", "gator_job_ready_keyed"),
        ):
            cursor.execute(
                "EXPLAIN SELECT id FROM django_gator_job WHERE queue = 'keyed' AND "
                f"state IN ('waiting', 'failed') AND concurrency_key {extra} AND "
                "next_execution_at <= statement_timestamp() "
                "ORDER BY priority DESC, next_execution_at, id LIMIT 10"
            )
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert index in plan + " ", plan
            assert "Sort" not in plan
        cursor.execute("RESET enable_seqscan")


# -- the limited claim ------------------------------------------------------------------------
def test_a_queue_limit_counts_running_rows_and_frees_slots_as_jobs_end():
    Queue.objects.set_limits("spans", concurrency=2, rate_limit="", by="ops")
    jobs = [Span.dispatch("/dev/null", "s", 0) for _ in range(5)]
    first = claim("spans", 10)
    assert first == [j.pk for j in jobs[:2]]
    assert claim("spans", 10, worker="w2") == []
    finish(first[:1])
    assert claim("spans", 10, worker="w2") == [jobs[2].pk]
    # Waiting jobs over the limit were not charged an attempt.
    assert set(Job.objects.filter(state=JobState.WAITING).values_list("attempts", flat=True)) == {0}


def test_a_key_backlog_does_not_block_other_keys():
    # 300 jobs of one key ahead of the others, higher priority: the other keys still run.
    KeyedSpan.dispatch_many([["/dev/null", "busy", 0]] * 300, priority=5)
    others = [KeyedSpan.dispatch("/dev/null", str(i), 0) for i in range(4)]
    taken = claim("keyed", 10)
    keys = Job.objects.filter(pk__in=taken).values_list("concurrency_key", flat=True)
    assert sorted(keys) == sorted(
        ["account:busy", "account:busy", *[f"account:{i}" for i in range(4)]]
    )
    assert {j.pk for j in others} <= set(taken)
    # The busy key is full: the next claim takes nothing of it, nor charges it.
    assert claim("keyed", 10, worker="w2") == []


def test_a_class_limit_without_a_key_holds_the_whole_class():
    jobs = [OneAtATime.dispatch("/dev/null", str(i), 0) for i in range(3)]
    assert claim("keyed", 10) == [jobs[0].pk]
    assert claim("keyed", 10) == []
    finish([jobs[0].pk])
    assert claim("keyed", 10) == [jobs[1].pk]


def test_a_rate_limit_counts_starts_in_the_window_and_prunes_the_ledger():
    engine = get_engine("default")
    jobs = [RatedSpan.dispatch("/dev/null", "k", 0) for _ in range(8)]
    other = RatedSpan.dispatch("/dev/null", "other", 0)
    first = claim("rated", 20)
    assert first == sorted([*(j.pk for j in jobs[:5]), other.pk])
    finish(first)
    # Finished or not, five started within the second: no more for key k until it passes.
    assert claim("rated", 20) == []
    assert FlowStart.objects.filter(scope=f"job:{RatedSpan.name}|k").count() == 5
    # A second later the window allows five more (three are left).
    FlowStart.objects.update(started_at=engine.db_now() - timedelta(seconds=1.01))
    assert claim("rated", 20) == [j.pk for j in jobs[5:]]
    # The starts that left their window were deleted.
    assert FlowStart.objects.filter(scope=f"job:{RatedSpan.name}|k").count() == 3


def test_a_queue_rate_limit():
    engine = get_engine("default")
    Queue.objects.set_limits("spans", concurrency=None, rate_limit="3/m", by="ops")
    jobs = [Span.dispatch("/dev/null", "s", 0) for _ in range(5)]
    assert claim("spans", 10) == [j.pk for j in jobs[:3]]
    finish([j.pk for j in jobs[:3]])
    assert claim("spans", 10) == []
    FlowStart.objects.update(started_at=engine.db_now() - timedelta(minutes=1, seconds=1))
    assert claim("spans", 10) == [j.pk for j in jobs[3:]]


def test_marks_are_written_in_the_claim_and_free_their_slots():
    engine = get_engine("default")
    flow = FlowClaims(engine)
    Queue.objects.set_limits("spans", concurrency=1, rate_limit=None, by="ops")
    jobs = [Span.dispatch("/dev/null", "s", 0) for _ in range(2)]
    [first], _ = flow.claim("w1", "spans", 5, limits_of)
    assert flow.claim("w1", "spans", 5, limits_of) == ([], [])
    [second], written = flow.claim("w1", "spans", 5, limits_of, marks=[Mark(first.id, 1, None)])
    assert (written, second.id) == ([jobs[0].pk], jobs[1].pk)
    assert Job.objects.get(pk=jobs[0].pk).state == JobState.SUCCEEDED


def test_a_deleted_queue_row_is_made_again():
    engine = get_engine("default")
    flow = FlowClaims(engine)
    jobs = [KeyedSpan.dispatch("/dev/null", str(i), 0) for i in range(2)]
    [first], _ = flow.claim("w1", "keyed", 1, limits_of)
    Queue.objects.all().delete()  # an operator deleted it in the admin
    [second], written = flow.claim("w1", "keyed", 1, limits_of, marks=[Mark(first.id, 1, None)])
    assert (written, second.id) == ([jobs[0].pk], jobs[1].pk)
    assert Queue.objects.filter(name="keyed").exists()


def test_a_paused_limited_queue_yields_nothing():
    Queue.objects.set_limits("spans", concurrency=5, rate_limit=None, by="ops")
    Span.dispatch("/dev/null", "s", 0)
    Queue.objects.pause("spans")
    assert claim("spans", 10) == []


def test_a_cancelled_candidate_is_not_claimed():
    job = KeyedSpan.dispatch("/dev/null", "1", 0)
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)
    assert claim("keyed", 10) == []


def test_concurrent_limited_claims_never_share_the_last_slot():
    """Threads, each with its own connection, claim the same queue at once."""
    Queue.objects.set_limits("spans", concurrency=3, rate_limit=None, by="ops")
    Span.dispatch_many([["/dev/null", "s", 0]] * 40)
    KeyedSpan.dispatch_many([["/dev/null", str(i % 3), 0] for i in range(30)])
    taken: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def fetch(n: int) -> None:
        try:
            barrier.wait()
            for _ in range(5):
                taken.extend(claim("spans", 2, worker=f"t{n}"))
                taken.extend(claim("keyed", 2, worker=f"t{n}"))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=fetch, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(taken) == len(set(taken))
    running = Job.objects.filter(state=JobState.RUNNING)
    assert running.filter(queue="spans").count() == 3
    per_key = sorted(running.filter(queue="keyed").values_list("concurrency_key", flat=True))
    assert per_key == ["account:0"] * 2 + ["account:1"] * 2 + ["account:2"] * 2


@pytest.mark.skipif(
    connection.vendor == "sqlite", reason="SQLite: a claim starts after the writer before it"
)
def test_a_claim_waiting_for_the_lock_counts_what_the_holder_committed():
    """The counts a claim makes (running jobs of the queue and of each key, ledger starts)
    are read after it got the queue's lock, so they include what the holder of the lock
    committed while the claim waited. On PostgreSQL a count read by the statement that
    waited for the lock would see the state from before that commit (its snapshot), and
    each claim below would take two more jobs than its limit allows."""
    engine = get_engine("default")
    Queue.objects.set_limits("spans", concurrency=2, rate_limit=None, by="ops")
    Queue.objects.set_limits("metered", concurrency=None, rate_limit="2/m", by="ops")
    Queue.objects.get_or_create(name="keyed")
    flows = {queue: FlowClaims(engine) for queue in ("spans", "keyed", "metered")}
    # A claim that has met the queue's rate (PostgreSQL then puts it in the statement).
    assert flows["metered"].claim("w1", "metered", 10, limits_of) == ([], [])
    spans = [Span.dispatch("/dev/null", "s", 0) for _ in range(4)]
    keyed = [KeyedSpan.dispatch("/dev/null", "1", 0) for _ in range(4)]  # 2 per key
    metered = [Span.dispatch("/dev/null", "s", 0, queue="metered") for _ in range(2)]
    results: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def claimer(queue: str) -> None:
        try:
            jobs, _ = flows[queue].claim(f"claimer-{queue}", queue, 10, limits_of)
            results[queue] = [job.id for job in jobs]
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(q,)) for q in ("spans", "keyed", "metered")]
    with transaction.atomic():
        # Another worker's claim, under the locks: the last jobs in claim order run now
        # (a count from before its commit would send the claims to the first ones).
        for name in ("spans", "keyed", "metered"):
            Queue.objects.select_for_update().get(name=name)
        now = engine.db_now()
        Job.objects.filter(pk__in=[j.pk for j in (*spans[2:], *keyed[2:])]).update(
            state=JobState.RUNNING, reserved_by="holder", attempts=1, locked_at=now, started_at=now
        )
        FlowStart.objects.bulk_create([FlowStart(scope="queue:metered", started_at=now)] * 2)
        for thread in threads:
            thread.start()
        # MariaDB refreshes its transaction table only when it was not read for 0.1 s.
        wait_for(lambda: waiting_on_locks() == 3, timeout=30, interval=0.2)
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert results == {"spans": [], "keyed": [], "metered": []}
    assert Job.objects.filter(state=JobState.RUNNING).count() == 4
    assert not Job.objects.filter(queue="metered").exclude(state=JobState.WAITING).exists()
    assert len(metered) == 2


def test_a_rate_limit_is_held_by_a_claim_that_had_seen_none():
    """PostgreSQL leaves the rate limits out of its statement while a queue shows none; a
    rate that appears since (on the queue's row, or on a class of the rows it reads) is
    still held, from the first claim that meets it."""
    engine = get_engine("default")
    flow = FlowClaims(engine)
    plain = [KeyedSpan.dispatch("/dev/null", str(i), 0, queue="mixed") for i in range(2)]
    taken, _ = flow.claim("w1", "mixed", 10, limits_of)
    assert sorted(j.id for j in taken) == [j.pk for j in plain]
    rated = [RatedSpan.dispatch("/dev/null", "k", 0, queue="mixed") for _ in range(7)]
    more = [KeyedSpan.dispatch("/dev/null", "9", 0, queue="mixed")]
    taken, _ = flow.claim("w1", "mixed", 20, limits_of)
    # Five a second for key k; the other class's job too.
    assert sorted(j.id for j in taken) == sorted([*(j.pk for j in rated[:5]), more[0].pk])
    assert FlowStart.objects.filter(scope=f"job:{RatedSpan.name}|k").count() == 5

    other = FlowClaims(engine)
    Queue.objects.set_limits("spans", concurrency=10, rate_limit=None, by="ops")
    spans = [Span.dispatch("/dev/null", "s", 0) for _ in range(5)]
    taken, _ = other.claim("w1", "spans", 1, limits_of)
    assert [j.id for j in taken] == [spans[0].pk]
    Queue.objects.set_limits("spans", concurrency=10, rate_limit="2/m", by="ops")
    taken, _ = other.claim("w1", "spans", 10, limits_of)
    assert [j.id for j in taken] == [j.pk for j in spans[1:3]]
    assert other.claim("w1", "spans", 10, limits_of) == ([], [])


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's one-trip claim")
def test_postgres_claims_in_one_round_trip_with_a_plan_prepared_once(settings):
    Queue.objects.set_limits("spans", concurrency=3, rate_limit=None, by="ops")
    spans = [Span.dispatch("/dev/null", "s", 0) for _ in range(5)]
    flow = FlowClaims(get_engine("default"))
    # The first claim reads the queue whole, the next from its keyset position: each
    # prepares its statement once.
    for _ in range(2):
        flow.claim("w1", "spans", 1, limits_of)
    with CaptureQueriesContext(connection) as sent:
        [third], _ = flow.claim("w1", "spans", 1, limits_of, marks=[Mark(spans[0].pk, 1, None)])
    [statement] = [q["sql"] for q in sent.captured_queries]
    assert "FOR UPDATE" in statement
    assert "; EXECUTE gator_flow_" in statement
    assert third.id == spans[2].pk
    assert Job.objects.get(pk=spans[0].pk).state == JobState.SUCCEEDED
    # Behind a transaction pooler nothing is prepared: the next transaction may run in
    # another session. The statement is sent whole, still in one round trip.
    settings.GATOR_POOLED_DATABASES = ["default"]
    with CaptureQueriesContext(connection) as sent:
        [fourth], _ = flow.claim("w1", "spans", 1, limits_of)
    assert fourth.id == spans[3].pk
    [statement] = [q["sql"] for q in sent.captured_queries]
    assert "EXECUTE" not in statement
    assert "PREPARE" not in statement
    assert "FOR UPDATE" in statement
    assert "; WITH t AS" in statement


# -- the worker's routing and the settings ------------------------------------------------------
def test_the_claimer_routes_limited_queues_and_keyed_jobs(settings):
    settings.GATOR_QUEUES = {"spans": {"concurrency": 2}}
    engine = get_engine("default")
    spans = [Span.dispatch("/dev/null", "s", 0) for _ in range(4)]
    keyed = [KeyedSpan.dispatch("/dev/null", "1", 0) for _ in range(3)]
    plain = Noop.dispatch(queue="keyed")
    claimer = Claimer(engine, "w1")
    jobs, _ = claimer.claim(20)
    assert sorted(j.id for j in jobs) == sorted(
        [spans[0].pk, spans[1].pk, keyed[0].pk, keyed[1].pk, plain.pk]
    )
    row = Queue.objects.get(name="spans")
    assert (row.concurrency, row.rate_limit, row.limits_by) == (2, "", "")


def test_settings_seed_the_rows_and_an_operator_edit_wins_until_given_back(settings):
    table = {"exports": {"concurrency": 5, "rate_limit": "10/s"}, "mail": {"rate_limit": "1/m"}}
    assert sorted(Queue.objects.sync_settings(table)) == ["exports", "mail"]
    assert Queue.objects.sync_settings(table) == []
    Queue.objects.set_limits("exports", concurrency=1, rate_limit=None, by="alice")
    table["exports"]["concurrency"] = 7
    del table["mail"]
    assert Queue.objects.sync_settings(table) == ["mail"]
    exports = Queue.objects.get(name="exports")
    assert (exports.concurrency, exports.rate_limit, exports.limits_by) == (1, "", "alice")
    assert exports.limits_at is not None
    assert not Queue.objects.get(name="mail").limited
    Queue.objects.use_settings("exports", table, by="bob")
    exports = Queue.objects.get(name="exports")
    assert (exports.concurrency, exports.rate_limit, exports.limits_by) == (7, "10/s", "")


def test_the_router_rests_a_queue_whose_limited_claim_found_nothing():
    engine = get_engine("default")
    now = [0.0]
    router = FlowRouter(engine, "w1", clock=lambda: now[0])
    KeyedSpan.dispatch_many([["/dev/null", "1", 0]] * 3)
    assert router.route("keyed") == (True, True)
    assert len(router.claim("keyed", 5)[0]) == 2
    assert router.claim("keyed", 5) == ([], [])
    assert router.route("keyed") == (True, False)
    now[0] += 0.5
    assert router.route("keyed") == (True, True)


def test_a_slot_freed_here_ends_the_rest_of_its_limited_claim():
    """A limited claim that found every slot taken rests LIMITED_BACKOFF seconds; a job of
    a limited class ending in this worker ends the rest (its slot is free now), a job
    without limits in the same queue does not."""
    engine = get_engine("default")
    now = [0.0]
    router = FlowRouter(engine, "w1", clock=lambda: now[0])
    KeyedSpan.dispatch_many([["/dev/null", "1", 0]] * 3)
    assert router.route("keyed") == (True, True)
    running, _ = router.claim("keyed", 5)
    assert len(running) == 2  # the key's two slots
    assert router.claim("keyed", 5) == ([], [])
    assert router.route("keyed") == (True, False)  # resting

    router.slot_freed("keyed", Noop.name)  # no limit: no slot of a limit freed
    assert router.route("keyed") == (True, False)
    assert engine.mark_succeeded("w1", [Mark.of(running[0], None)]) == [running[0].id]
    router.slot_freed("keyed", running[0].name)
    assert router.route("keyed") == (True, True)
    [third] = router.claim("keyed", 5)[0]
    assert third.id not in {j.id for j in running}


def test_a_limited_queue_resting_after_its_slots_were_taken_is_claimed_once_one_frees(settings):
    """A queue with a concurrency limit: in a round that finds other work, a job of it that
    ended in this worker gets its next job claimed at once, without waiting out the rest
    of its empty claim (without the freed slot, that round claims the other work only)."""
    settings.GATOR_QUEUES = {"spans": {"concurrency": 1}}
    now = [0.0]
    specs = [QueueSpec("spans"), QueueSpec("other")]
    claimer = Claimer(get_engine("default"), "w1", specs, clock=lambda: now[0])
    spans = [Span.dispatch("/dev/null", "s", 0) for _ in range(2)]
    [first] = claimer.claim(5)[0]
    assert first.id == spans[0].pk
    assert claimer.claim(5) == ([], [])  # the slot is taken
    assert claimer.flow.resting("spans")

    busy = Noop.dispatch(queue="other")
    jobs, written = claimer.claim(5, [Mark.of(first, None)], freed=[("spans", first.name)])
    assert written == [first.id]
    assert sorted(j.id for j in jobs) == sorted([spans[1].pk, busy.pk])


def test_the_router_reads_little_when_idle_and_sees_a_new_limit_within_its_ttl(monkeypatch):
    """An idle worker's router reads the queues' limits once per LIMITS_TTL, and looks for
    keyed jobs only while a limited class is registered; a limit set meanwhile reaches it
    by the next read of the limits."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_gator.worker import flow as worker_flow

    engine = get_engine("default")
    now = [0.0]
    router = FlowRouter(engine, "w1", clock=lambda: now[0])
    router.refresh()  # the first refresh also writes GATOR_QUEUES into the rows
    now[0] += worker_flow.ROUTES_TTL
    with CaptureQueriesContext(connection) as reads:
        router.refresh()
    assert len(reads) == 1  # the keyed jobs (test classes with limits are registered)
    now[0] += worker_flow.ROUTES_TTL
    monkeypatch.setattr(worker_flow, "registered_jobs", lambda: {Noop.name: Noop})
    with CaptureQueriesContext(connection) as reads:
        router.refresh()
    assert len(reads) == 0
    assert router.keyed == set()

    Queue.objects.set_limits("spans", concurrency=1, rate_limit=None, by="alice")
    now[0] = worker_flow.LIMITS_TTL - worker_flow.ROUTES_TTL / 2
    assert router.route("spans") == (True, False)  # not read yet: the claim probe refuses it
    now[0] += worker_flow.ROUTES_TTL
    with CaptureQueriesContext(connection) as reads:
        assert router.route("spans") == (False, True)
    assert len(reads) == 1


def test_the_system_check_names_bad_queue_settings(settings):
    settings.GATOR_QUEUES = {"exports": {"concurrency": 5, "burst": 3}, "bad name": {}}
    found = {m.id: m.msg for m in checks.run_checks() if m.id.startswith("django_gator")}
    assert "'burst'" in found["django_gator.W005"]
    assert "'bad name'" in found["django_gator.E003"]
    settings.GATOR_QUEUES = {"exports": {"rate_limit": "0/s"}}
    found = {m.id: m.msg for m in checks.run_checks() if m.id.startswith("django_gator")}
    assert "'0/s'" in found["django_gator.E003"]


# -- the dashboard, the admin form and the commands -------------------------------------------
DASHBOARD = "admin:django_gator_job_dashboard"
LIMITS = "admin:django_gator_job_queue_limits"


def test_the_dashboard_shows_running_over_limit_and_the_rate():
    Queue.objects.set_limits("spans", concurrency=5, rate_limit="10/s", by="alice")
    for _ in range(3):
        Span.dispatch("/dev/null", "s", 0)
    assert len(claim("spans", 2)) == 2
    Noop.dispatch(queue="plain")
    page = operator().get(reverse(DASHBOARD)).content.decode()
    assert "2/5, 10/s" in page
    assert "set by alice" in page
    assert f'href="{reverse(LIMITS)}?queue=plain"' in page


def test_the_limits_form_needs_the_permission_and_csrf_and_records_who():
    url = reverse(LIMITS)
    form = {"queue": "exports", "concurrency": "5", "rate_limit": "100/m"}
    assert operator().post(url, form).status_code == 403
    client = operator("change_queue", name="op2")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="op2"))
    assert strict.post(url, form).status_code == 403
    assert not Queue.objects.exists()

    response = client.post(url, form, follow=True)
    assert response.redirect_chain[-1][0] == reverse(DASHBOARD)
    row = Queue.objects.get(name="exports")
    assert (row.concurrency, row.rate_limit, row.limits_by) == (5, "100/m", "op2")
    assert "exports" in client.get(url, {"queue": "exports"}).content.decode()

    client.post(url, {"queue": "exports", "use_settings": "1"})
    row = Queue.objects.get(name="exports")
    assert (row.concurrency, row.rate_limit, row.limits_by) == (None, "", "")


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("concurrency", "0", "got 0"),
        ("concurrency", "-2", "got -2"),
        ("rate_limit", "100 per minute", "&#x27;100 per minute&#x27;"),
        ("rate_limit", "0/s", "&#x27;0/s&#x27;"),
        ("queue", "no spaces", "invalid queue name"),
    ],
)
def test_the_limits_form_shows_an_error_naming_the_bad_value(field, value, shown):
    form = {"queue": "exports", "concurrency": "", "rate_limit": "", field: value}
    response = operator("change_queue").post(reverse(LIMITS), form)
    assert response.status_code == 200
    page = response.content.decode()
    assert "errorlist" in page
    assert shown in page
    assert not Queue.objects.exists()


def test_gator_queue_list_and_gator_status_show_limits():
    Queue.objects.set_limits("spans", concurrency=3, rate_limit="2/s", by="ops")
    Span.dispatch("/dev/null", "s", 0)
    Noop.dispatch(queue="plain")
    out = StringIO()
    call_command("gator_queue", "list", stdout=out)
    lines = {line.split()[0]: line for line in out.getvalue().splitlines()[1:]}
    assert lines["spans"].rstrip().endswith("0/3, 2/s")
    assert lines["plain"].rstrip().endswith("-")
    out = StringIO()
    call_command("gator_queue", "list", "--json", stdout=out)
    by_name = {q["queue"]: q for q in json.loads(out.getvalue())}
    assert (by_name["spans"]["concurrency"], by_name["spans"]["rate_limit"]) == (3, "2/s")
    assert by_name["plain"]["concurrency"] is None

    out = StringIO()
    call_command("gator_status", stdout=out)
    assert "0/3, 2/s" in out.getvalue()
    out = StringIO()
    call_command("gator_status", "--json", stdout=out)
    queues = {q["queue"]: q for q in json.loads(out.getvalue())["queues"]}
    assert (queues["spans"]["concurrency"], queues["spans"]["limits_by"]) == (3, "ops")


def test_a_burst_worker_drains_a_single_key_one_at_a_time(tmp_path):
    from tests.reliability.test_flow_workers import max_overlap

    ledger = tmp_path / "ledger.txt"
    jobs = KeyedSpan.dispatch_many([[str(ledger), "one", 0.02]] * 6)
    run_worker("keyed", concurrency=4)
    assert {j.refresh_state() for j in jobs} == {JobState.SUCCEEDED}
    spans = sorted(
        (float(line.split()[2]), float(line.split()[3])) for line in ledger.read_text().splitlines()
    )
    # Two per key at once at most (KeyedSpan.concurrency_limit), and the limit was used.
    assert max_overlap(spans) == 2


def test_a_burst_worker_waits_for_a_rate_window_and_runs_every_due_job(tmp_path):
    ledger = tmp_path / "ledger.txt"
    jobs = RatedSpan.dispatch_many([[str(ledger), "k", 0]] * 7)  # 5 a second for key k
    run_worker("rated", concurrency=4)
    rows = Job.objects.filter(pk__in=[j.pk for j in jobs])
    assert set(rows.values_list("state", flat=True)) == {JobState.SUCCEEDED}
    starts = sorted(rows.values_list("locked_at", flat=True))
    assert starts[5] - starts[0] >= timedelta(seconds=1)


def test_a_burst_worker_waits_for_a_slot_held_by_a_job_running_elsewhere():
    Queue.objects.set_limits("spans", concurrency=1, rate_limit=None, by="test")
    holder = WorkerFactory()
    elsewhere = JobFactory(running=True, name=Span.name, queue="spans", reserved_by=holder.id)
    jobs = [Span.dispatch("/dev/null", "s", 0) for _ in range(2)]
    worker = WorkerProcess(
        parse_queue_specs(["spans"]), concurrency=2, burst=True, install_signal_handlers=False
    )
    thread = start_worker_thread(worker)
    # Its claim found the slot held: it stays on, idle, instead of ending.
    wait_for(lambda: worker.slots.idle.is_set() or not thread.is_alive(), timeout=30)
    assert thread.is_alive(), "the burst worker ended while a slot it waits for was held"
    assert {j.refresh_state() for j in jobs} == {JobState.WAITING}
    Job.objects.filter(pk=elsewhere.pk).update(state=JobState.SUCCEEDED, finished_at=timezone.now())
    thread.join(60)
    assert not thread.is_alive()
    ended = Job.objects.get(pk=elsewhere.pk)
    assert (ended.state, ended.rescues) == (JobState.SUCCEEDED, 0)
    rows = Job.objects.filter(pk__in=[j.pk for j in jobs])
    assert set(rows.values_list("state", flat=True)) == {JobState.SUCCEEDED}
    # (Not compared: the claims' locked_at with finished_at. On MariaDB NOW() is the time a
    # statement began, and a claim that began before the slot was freed waits on the lock
    # and then claims, stamped earlier than the freeing: CI saw it. That they waited while
    # the slot was held is asserted above.)


def test_a_burst_worker_does_not_wait_for_paused_queues_or_scheduled_jobs():
    Queue.objects.set_limits("spans", concurrency=1, rate_limit=None, by="test")
    holder = WorkerFactory()
    elsewhere = JobFactory(running=True, name=Span.name, queue="spans", reserved_by=holder.id)
    held = Span.dispatch("/dev/null", "s", 0)  # held back by the slot, in a paused queue
    Queue.objects.pause("spans")
    later = KeyedSpan.dispatch("/dev/null", "1", 0, wait=3600)  # due in an hour
    run_worker("spans", "keyed", concurrency=2)
    # It left at once: long before the holder's heartbeat lapsed (nothing was rescued).
    assert Job.objects.get(pk=elsewhere.pk).state == JobState.RUNNING
    assert {held.refresh_state(), later.refresh_state()} == {JobState.WAITING}


def test_the_ordinary_claim_of_a_queue_busy_with_limited_jobs_rests():
    """A queue that holds jobs of limited classes and others: while its ordinary claim
    finds nothing and the limited claim is made, the ordinary claim rests PLAIN_REST
    seconds, unless a round finds nothing else."""
    from django_gator.worker.claims import PLAIN_REST

    now = [0.0]
    claimer = Claimer(get_engine("default"), "w1", [QueueSpec("keyed")], clock=lambda: now[0])
    keyed = KeyedSpan.dispatch_many([["/dev/null", str(i), 0] for i in range(4)])
    assert sorted(j.id for j in claimer.claim(2)[0]) == [j.pk for j in keyed[:2]]
    # The ordinary claim's turn to go first: it finds nothing, and rests.
    assert [j.id for j in claimer.claim(1)[0]] == [keyed[2].pk]
    plain = Noop.dispatch(queue="keyed")
    assert [j.id for j in claimer.claim(1)[0]] == [keyed[3].pk]  # resting
    now[0] += PLAIN_REST
    late = Noop.dispatch(queue="keyed")
    # The limited claim finds nothing (and rests), the ordinary one takes the plain job.
    assert [j.id for j in claimer.claim(1)[0]] == [plain.pk]
    assert [j.id for j in claimer.claim(1)[0]] == [late.pk]


def test_a_resting_ordinary_claim_is_made_in_a_round_that_found_nothing_else():
    now = [0.0]
    claimer = Claimer(get_engine("default"), "w1", [QueueSpec("keyed")], clock=lambda: now[0])
    keyed = KeyedSpan.dispatch_many([["/dev/null", str(i), 0] for i in range(3)])
    assert sorted(j.id for j in claimer.claim(2)[0]) == [j.pk for j in keyed[:2]]
    assert [j.id for j in claimer.claim(1)[0]] == [keyed[2].pk]  # the ordinary claim rests
    late = Noop.dispatch(queue="keyed")
    assert [j.id for j in claimer.claim(1)[0]] == [late.pk]


def test_limited_jobs_behind_a_backlog_of_others_in_their_queue_get_their_turn():
    """In a queue served by both claims the limited one goes first once every
    LIMITED_TURN seconds: jobs of limited classes dispatched behind a backlog of jobs
    without limits are not left until that backlog is gone (with the ordinary claim always
    first, a queue busy with plain jobs starved its limited ones), and the next round is
    the ordinary claim's."""
    from django_gator.worker.claims import LIMITED_TURN

    now = [0.0]
    claimer = Claimer(get_engine("default"), "w1", [QueueSpec("keyed")], clock=lambda: now[0])
    plain = [Noop.dispatch(queue="keyed") for _ in range(6)]
    keyed = KeyedSpan.dispatch_many([["/dev/null", str(i), 0] for i in range(6)])

    def claim() -> list[int]:
        return [j.id for j in claimer.claim(2)[0]]

    assert claim() == [j.pk for j in keyed[:2]]
    assert claim() == [j.pk for j in plain[:2]]
    assert claim() == [j.pk for j in plain[2:4]]  # the limited claim's turn has not come
    now[0] += LIMITED_TURN
    assert claim() == [j.pk for j in keyed[2:4]]


def test_a_queue_served_by_both_claims_pays_one_limited_claim_per_turn():
    """After a short ordinary claim the limited one is made only when its turn is due
    (every LIMITED_TURN seconds per queue and worker): each takes the queue row's lock,
    which serializes every worker's limited claims of the queue."""
    from django_gator.worker.claims import LIMITED_TURN

    now = [0.0]
    claimer = Claimer(get_engine("default"), "w1", [QueueSpec("keyed")], clock=lambda: now[0])
    keyed = KeyedSpan.dispatch_many([["/dev/null", str(i), 0] for i in range(6)])
    plain = [Noop.dispatch(queue="keyed") for _ in range(2)]

    def claim() -> list[int]:
        return sorted(j.id for j in claimer.claim(4)[0])

    assert claim() == [j.pk for j in keyed[:4]]
    assert claim() == [j.pk for j in plain]  # short, and no limited claim until its turn
    now[0] += LIMITED_TURN
    assert claim() == [j.pk for j in keyed[4:]]


def test_keyset_reads_find_higher_priorities_and_back_dated_jobs(monkeypatch):
    from django_gator.engines import flow_keyset

    engine = get_engine("default")
    flow = FlowClaims(engine)
    Queue.objects.set_limits("spans", concurrency=100, rate_limit=None, by="ops")
    jobs = [Span.dispatch("/dev/null", "s", 0) for _ in range(6)]

    def take(n: int) -> list[int]:
        claimed, _ = flow.claim("w1", "spans", n, limits_of)
        return [j.id for j in claimed]

    assert take(2) == [j.pk for j in jobs[:2]]
    assert take(2) == [j.pk for j in jobs[2:4]]  # from the position (PostgreSQL)
    urgent = Span.dispatch("/dev/null", "s", 0, priority=9)
    old = Span.dispatch("/dev/null", "s", 0, at=engine.db_now() - timedelta(minutes=5))
    assert take(1) == [urgent.pk]  # a higher priority is read whole
    # The back-dated job lies before the position: found at the latest by the next full
    # read, here forced at once.
    monkeypatch.setattr(flow_keyset, "FULL_READ_EVERY", 0.0)
    assert take(1) == [old.pk]
    assert take(5) == [j.pk for j in jobs[4:]]
