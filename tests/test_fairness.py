"""Weighted fair share between tenants (docs/fairness.md): stamps given at dispatch, the
fair claim's order, concurrent dispatchers, the upkeep, the system check, and the shares
three real worker processes serve."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from django.core import checks
from django.db import close_old_connections, connection, connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_gator import Queueable, conf
from django_gator.engines import get_engine
from django_gator.engines.contract import behind
from django_gator.engines.fairness import fair_upkeep
from django_gator.models import FairShare, Job, JobState
from tests.testapp.jobs import FairWork

pytestmark = pytest.mark.django_db(transaction=True)


def _claim(count: int, queue: str = "fair") -> list[Any]:
    """``count`` jobs claimed ten at a time, in the order the claims took them."""
    engine = get_engine(conf.database())
    taken: list[Any] = []
    while len(taken) < count:
        got = engine.claim("test-worker", queue, min(10, count - len(taken)))
        if not got:
            break
        taken += got
    return taken


def _tenants(jobs: list[Any]) -> Counter[str]:
    return Counter(job.args[0] for job in jobs)


def _backlog(tenant: str, count: int) -> list[Job]:
    return FairWork.dispatch_many([[tenant, n] for n in range(count)])


# -- dispatch ------------------------------------------------------------------------------


class BadKey(Queueable):
    name = "tests.fairness.BadKey"
    queue = "fair"
    returned: Any = None

    def fairness_key(self, n: int) -> Any:
        return type(self).returned

    def handle(self, n: int) -> None:
        return None


@pytest.mark.parametrize(
    ("returned", "error", "message"),
    [
        (7, TypeError, r"BadKey\.fairness_key\(\) must return a str or None, got 7"),
        ("", ValueError, r"BadKey\.fairness_key\(\) returned '': use 1 to 200"),
        ("x" * 201, ValueError, r"BadKey\.fairness_key\(\) returned 'xxx.*: use 1 to 200"),
    ],
)
def test_a_bad_fairness_key_is_refused_naming_the_job_and_value(returned, error, message):
    BadKey.returned = returned
    with pytest.raises(error, match=message):
        BadKey.dispatch(1)
    assert not Job.objects.filter(name=BadKey.name).exists()


@pytest.mark.parametrize("notify", [True, False], ids=["notify", "datagrams"])
def test_fair_jobs_carry_their_key_and_stamps_a_step_of_one_over_the_weight_apart(notify):
    # GATOR_NOTIFY = False: PostgreSQL's INSERT without its NOTIFY is stamped once too.
    with override_settings(GATOR_NOTIFY=notify):
        small = _backlog("tenant:a", 3)
        big = _backlog("tenant:big", 3)
    _check_stamps(small, big)


def _check_stamps(small: list[Job], big: list[Job]) -> None:
    rows = {j.pk: j for j in Job.objects.filter(queue="fair")}
    assert [rows[j.pk].fairness_key for j in small] == ["tenant:a"] * 3
    a_stamps = [rows[j.pk].fair_order for j in small]
    big_stamps = [rows[j.pk].fair_order for j in big]
    assert a_stamps == pytest.approx([1.0, 2.0, 3.0])
    # The newcomer starts at the queue's virtual time (the head: tenant:a's first stamp).
    assert big_stamps == pytest.approx([1 + 1 / 3, 1 + 2 / 3, 2.0])
    shares = {s.fairness_key: s.last_stamp for s in FairShare.objects.filter(queue="fair")}
    assert shares == pytest.approx({"tenant:a": 3.0, "tenant:big": 2.0})


def test_jobs_of_other_queues_get_no_stamp_and_no_counter():
    with CaptureQueriesContext(connection) as queries:
        job = FairWork.dispatch("tenant:a", queue="plain")
        FairWork.dispatch_many([["tenant:a", n] for n in range(3)], queue="plain")
    # Nothing more than the INSERTs: no counter, no stamp, no read of the fair index.
    assert not [q for q in queries if "fair" in q["sql"]]
    row = Job.objects.get(pk=job.pk)
    assert (row.fairness_key, row.fair_order) == (None, None)
    assert not FairShare.objects.exists()


# -- the claim -----------------------------------------------------------------------------


def test_claims_serve_waiting_tenants_in_proportion_to_their_weights():
    # tenant:big queued first and far more; the others arrive after it.
    _backlog("tenant:big", 600)
    _backlog("tenant:a", 200)
    _backlog("tenant:b", 200)
    served = _tenants(_claim(250))
    # Weights 3 : 1 : 1 -> 150 : 50 : 50, whatever the backlogs.
    assert served["tenant:big"] == pytest.approx(150, abs=3)
    assert served["tenant:a"] == pytest.approx(50, abs=3)
    assert served["tenant:b"] == pytest.approx(50, abs=3)


def test_a_lone_tenant_gets_the_whole_queue_in_dispatch_order():
    jobs = _backlog("tenant:a", 40)
    taken = _claim(100)
    assert [j.id for j in taken] == [j.pk for j in jobs]


def test_a_newcomer_is_served_at_once_beside_a_big_backlog():
    _backlog("tenant:big", 1000)
    _claim(100)  # the queue has moved on
    newcomer = _backlog("tenant:c", 10)
    taken = _claim(42)
    # Weights 3 : 1: the newcomer's 10 jobs (stamps from the head's + 1 to + 10) within
    # the next 41 claims (beside tenant:big's 31 stamps in that span), not after 900.
    assert {j.id for j in taken if j.args[0] == "tenant:c"} == {j.pk for j in newcomer}


def test_priority_comes_first_and_fair_order_within_a_priority():
    _backlog("tenant:big", 30)
    urgent = FairWork.dispatch("tenant:a", 99, priority=5)
    taken = _claim(5)
    assert taken[0].id == urgent.pk
    assert _tenants(taken[1:]) == {"tenant:big": 4}


def test_each_priority_has_its_own_virtual_time():
    _backlog("tenant:a", 50)  # priority 0: stamps 1 to 50
    FairWork.dispatch_many([["tenant:big", n] for n in range(300)], priority=5)
    _claim(20)  # priority first: tenant:big's, far ahead in stamps
    newcomer = _backlog("tenant:c", 10)  # priority 0 again, beside tenant:a's backlog
    Job.objects.filter(queue="fair", priority=5).update(state=JobState.SUCCEEDED)
    taken = _claim(22)
    # It starts at priority 0's head (tenant:a's first stamp, 1), not at priority 5's:
    # stamps 2 to 11, one for one with tenant:a's (21 claims), not after its 50 jobs.
    assert {j.id for j in taken if j.args[0] == "tenant:c"} == {j.pk for j in newcomer}


def test_the_fair_claim_is_one_ordered_scan_of_its_own_index_on_postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's plan (SQLite and MariaDB name their index in the claim)")
    _backlog("tenant:big", 3000)
    _backlog("tenant:a", 100)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_gator_job")
        sql, params = behind(get_engine("default"))._picked("fair", 10, None)
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "gator_job_ready_fair" in plan, plan
    assert "Sort" not in plan, plan  # read in the claim's order, stopping at the limit


def test_django_tasks_in_a_fair_queue_are_stamped_as_the_keyless_tenant():
    from tests.testapp import tasks

    with override_settings(GATOR_FAIRNESS={"tasks": {}}):
        result = tasks.render_report.enqueue(7, fmt="csv")
        assert [j.id for j in _claim(1, queue="tasks")] == [int(result.id)]
    row = Job.objects.get(pk=int(result.id))
    assert (row.fairness_key, row.fair_order) == (None, 1.0)
    assert FairShare.objects.get(queue="tasks").fairness_key == ""


def test_a_retried_job_keeps_its_stamp():
    [job] = _backlog("tenant:a", 1)
    before = Job.objects.get(pk=job.pk).fair_order
    [claimed] = _claim(1)
    Job.objects.filter(pk=claimed.id).update(state=JobState.FAILED, reserved_by=None)
    assert Job.objects.get(pk=job.pk).fair_order == before
    assert [j.id for j in _claim(1)] == [job.pk]


def test_the_upkeep_stamps_rows_left_without_a_stamp_and_prunes_counters():
    _backlog("tenant:a", 5)
    stray = FairWork.dispatch("tenant:b", queue="plain")
    # As if the queue had been made fair with this row waiting (or a retry moved it in).
    Job.objects.filter(pk=stray.pk).update(queue="fair")
    assert stray.pk not in {j.id for j in _claim(10)}  # the fair claim cannot see it
    Job.objects.filter(queue="fair").update(state=JobState.WAITING, reserved_by=None)
    engine = get_engine(conf.database())
    assert fair_upkeep(engine) == 1
    row = Job.objects.get(pk=stray.pk)
    assert row.fair_order is not None
    assert row.fairness_key is None  # stored as it was: the keyless tenant's stamp
    assert stray.pk in {j.id for j in _claim(10)}
    # Everything was served: one counter keeps the virtual time.
    Job.objects.filter(queue="fair").update(state=JobState.SUCCEEDED)
    fair_upkeep(engine)
    assert FairShare.objects.filter(queue="fair").count() == 1


def test_counters_of_queues_no_longer_fair_are_deleted():
    _backlog("tenant:a", 2)
    with override_settings(GATOR_FAIRNESS={}):
        fair_upkeep(get_engine(conf.database()))
    assert not FairShare.objects.exists()


# -- concurrent dispatchers ----------------------------------------------------------------


def test_twenty_concurrent_dispatchers_never_share_or_skip_a_stamp():
    _backlog("tenant:a", 1)  # the queue's virtual time: 1
    barrier = threading.Barrier(20)
    errors: list[BaseException] = []

    def dispatch(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            tenant = "tenant:big" if index % 2 else "tenant:c"
            FairWork.dispatch_many([[tenant, n] for n in range(10)])
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            close_old_connections()
            connections[conf.database()].close()

    threads = [threading.Thread(target=dispatch, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    for tenant, step in (("tenant:big", 1 / 3), ("tenant:c", 1.0)):
        stamps = sorted(
            Job.objects.filter(fairness_key=tenant).values_list("fair_order", flat=True)
        )
        assert len(stamps) == 100
        # One run of steps: no two jobs share a stamp, no step is skipped.
        assert stamps == pytest.approx([1 + step * (i + 1) for i in range(100)])
        counter = FairShare.objects.get(queue="fair", fairness_key=tenant).last_stamp
        assert counter == pytest.approx(stamps[-1])


def test_a_fair_dispatch_ended_to_break_a_deadlock_is_run_again(monkeypatch):
    """InnoDB may end one of two concurrent fair dispatches to break a deadlock (seen in CI
    with the twenty dispatchers above): a dispatch in a transaction of its own is run
    again, whole, as the other deadlock-prone writes are."""
    from django.db import DatabaseError

    engine_class = type(get_engine(conf.database()))
    stamp_jobs = engine_class.stamp_jobs
    tries: list[int] = []

    def ended_once(self: Any, *args: Any, **kwargs: Any) -> None:
        tries.append(1)
        if len(tries) == 1:
            raise DatabaseError("test: the database ended this transaction (deadlock)")
        stamp_jobs(self, *args, **kwargs)

    monkeypatch.setattr(engine_class, "stamp_jobs", ended_once)
    monkeypatch.setattr(engine_class, "is_deadlock", lambda self, exc: "(deadlock)" in str(exc))
    jobs = FairWork.dispatch_many([["tenant:d", n] for n in range(3)])
    assert len(tries) == 2
    rows = Job.objects.filter(fairness_key="tenant:d").order_by("id")
    assert [row.pk for row in rows] == [job.pk for job in jobs]  # the first try left nothing
    assert all(row.fair_order is not None for row in rows)


# -- the system check ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["fair"], "GATOR_FAIRNESS must be a dict of queue names to options, got ['fair']"),
        ({"fair": 3}, "GATOR_FAIRNESS['fair'] must be a dict of options"),
        ({"fair": {"weight": {}}}, "GATOR_FAIRNESS['fair'] has the unknown option 'weight'"),
        ({"fair": {"weights": {"t": 0}}}, "['weights']['t'] must be a number above 0"),
        ({"fair": {"weights": {"t": -2}}}, "['weights']['t'] must be a number above 0"),
        ({"fair": {"weights": {"t": "3"}}}, "got '3'"),
        ({"fair": {"weights": ["t"]}}, "['weights'] must be a dict of fairness keys"),
    ],
)
def test_the_check_refuses_a_bad_fairness_table(value, message):
    with override_settings(GATOR_FAIRNESS=value):
        found = [m for m in checks.run_checks() if m.id == "django_gator.E013"]
    assert len(found) == 1
    assert message in found[0].msg


def test_the_check_accepts_the_tests_table_and_warns_of_an_unused_fairness_key():
    found = [m for m in checks.run_checks() if m.id in ("django_gator.E013", "django_gator.W009")]
    assert not [m for m in found if m.id == "django_gator.E013" or "FairWork" in m.msg]
    with override_settings(GATOR_FAIRNESS={"other": {}}):
        found = [m for m in checks.run_checks() if m.id == "django_gator.W009"]
    assert [m.msg for m in found if "FairWork" in m.msg]


# -- real worker processes -----------------------------------------------------------------


def test_three_worker_processes_serve_tenants_within_ten_percent_of_their_weights(
    spawn_worker,
):
    _backlog("tenant:big", 900)
    _backlog("tenant:a", 300)
    _backlog("tenant:b", 300)
    workers = [spawn_worker("--concurrency", "4", "-q", "fair") for _ in range(3)]
    deadline = time.monotonic() + 180
    done = Job.objects.filter(queue="fair", state=JobState.SUCCEEDED)
    while done.count() < 1500 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert done.count() == 1500, [w.poll() for w in workers]
    # The first 600 starts, while all three had work: 3 : 1 : 1 is 360 : 120 : 120.
    first = list(Job.objects.filter(queue="fair").order_by("started_at", "fair_order")[:600])
    served = Counter(job.fairness_key for job in first)
    assert served["tenant:big"] == pytest.approx(360, rel=0.10)
    assert served["tenant:a"] == pytest.approx(120, rel=0.10)
    assert served["tenant:b"] == pytest.approx(120, rel=0.10)
