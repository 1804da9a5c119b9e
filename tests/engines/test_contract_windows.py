"""The contract's windows and expiry: a windowed insert decided by the indexes of migration
0023, expiries written by database time, and every claim path leaving an expired job."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_gator.dbtime import DbNow
from django_gator.engines import get_engine
from django_gator.engines.core import Position
from django_gator.models import Job, JobState
from django_gator.rows import InsertRow
from django_gator.windows import Window
from tests.engines.conformance import covers
from tests.testapp.jobs import Echo

pytestmark = pytest.mark.django_db(transaction=True)


def _row(key: str, args: str = "[]") -> InsertRow:
    return InsertRow(Echo.name, args, "{}", "echo", 0, None, unique_key=key)


@covers("insert_windowed")
def test_a_windowed_insert_answers_per_key_and_kind():
    engine = get_engine("default")
    kept = engine.insert_windowed([_row("a"), _row("a")], Window("unique_for", 60))
    assert [(a[0] == kept[0][0], a[3]) for a in kept] == [(True, True), (True, False)]
    Job.objects.filter(pk=kept[0][0]).update(state=JobState.SUCCEEDED, finished_at=DbNow())
    [(again, _, _, created)] = engine.insert_windowed([_row("a")], Window("unique_for", 60))
    assert (again, created) == (kept[0][0], False)

    debounced = engine.insert_windowed(
        [_row("b", '["x"]'), _row("b", '["y"]')], Window("debounce", 5)
    )
    assert debounced[0][0] == debounced[1][0]
    assert [d[3] for d in debounced] == [True, False]
    row = Job.objects.get(pk=debounced[0][0])
    assert (row.args, row.unique_key, row.dedupe_key) == (["y"], None, "b")
    assert row.next_execution_at == debounced[1][2]

    [(first, _, _, _)] = engine.insert_windowed([_row("c")], Window("throttle", 5))
    [(joined, _, _, created)] = engine.insert_windowed([_row("c")], Window("throttle", 5))
    assert (joined, created) == (first, False)


@covers("set_expiry", "expired_ids")
def test_expiries_are_written_by_database_time_and_found_once_past():
    engine = get_engine("default")
    jobs = [Echo.dispatch(n) for n in range(3)]
    now = engine.db_now()
    engine.set_expiry([jobs[0].pk], now - timedelta(seconds=5), None)
    engine.set_expiry([jobs[1].pk], None, 600)
    [soon, later, plain] = Job.objects.filter(pk__in=[j.pk for j in jobs]).order_by("pk")
    assert soon.expires_at == now - timedelta(seconds=5)
    assert now + timedelta(seconds=599) <= later.expires_at <= now + timedelta(seconds=660)
    assert plain.expires_at is None
    assert engine.expired_ids(10) == [soon.pk]
    Job.objects.filter(pk=soon.pk).update(state=JobState.RUNNING, reserved_by="w", locked_at=now)
    assert engine.expired_ids(10) == []  # a running job is no longer the sweep's


@covers("claim_and_mark")
def test_no_claim_path_takes_an_expired_job():
    engine = get_engine("default")
    expired = Echo.dispatch("expired", priority=5)
    live = Echo.dispatch("live", priority=5)
    engine.set_expiry([expired.pk], engine.db_now() - timedelta(seconds=1), None)
    claimed, _ = engine.claim_and_mark("w", "echo", 10, [])
    assert [job.id for job in claimed] == [live.pk]
    if engine.supports_keyset:
        Job.objects.filter(pk=live.pk).update(state=JobState.WAITING, reserved_by=None)
        start = Position({5: (expired.next_execution_at, 0)}, 1.0)
        claimed, _ = engine.claim_and_mark("w", "echo", 10, [], after=start)
        assert [job.id for job in claimed] == [live.pk]
    assert engine.claim_by_id("w", expired.pk) is None
    assert Job.objects.get(pk=expired.pk).state == JobState.WAITING
