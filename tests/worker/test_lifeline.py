"""The lifeline: heartbeats, and rescuing the jobs of workers that stopped heartbeating."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from django_gator.engines import get_engine
from django_gator.models import Job, JobState
from django_gator.worker.lifeline import Lifeline
from tests.testapp.jobs import (
    Echo,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_rescue_takes_back_only_jobs_whose_worker_stopped_heartbeating():
    from django_gator.models import Worker

    engine = get_engine("default")
    Worker.objects.create(id="alive", hostname="h", pid=1, concurrency=1)
    Worker.objects.create(
        id="stale",
        hostname="h",
        pid=2,
        concurrency=1,
        heartbeat_at=timezone.now() - timedelta(minutes=10),
    )
    Echo.dispatch_many([["a"], ["b"], ["c"]])
    [alive_job] = engine.claim("alive", "echo", 1)
    [stale_job] = engine.claim("stale", "echo", 1)
    [orphan_job] = engine.claim("never-registered", "echo", 1)

    Lifeline(engine, "rescuer").rescue()

    states = {
        job.pk: (job.state, job.rescues, job.attempts)
        for job in Job.objects.filter(pk__in=[alive_job.id, stale_job.id, orphan_job.id])
    }
    assert states == {
        alive_job.id: (JobState.RUNNING, 0, 1),
        stale_job.id: (JobState.WAITING, 1, 1),
        orphan_job.id: (JobState.WAITING, 1, 1),
    }
    assert set(Worker.objects.values_list("id", flat=True)) == {"alive"}
    assert "stopped heartbeating" in Job.objects.get(pk=stale_job.id).last_error


def test_after_a_gap_in_its_own_heartbeats_a_worker_waits_before_judging_others():
    # Everyone was stopped by the same stall (a database outage, a frozen SQLite writer
    # holding the lock): the peer's heartbeat looks lapsed, but it is alive and is about to
    # heartbeat again. The first worker back must not rescue its job in the meantime.
    from django_gator import conf
    from django_gator.models import Worker

    engine = get_engine("default")
    stalled = timezone.now() - timedelta(minutes=10)
    Worker.objects.create(id="peer", hostname="h", pid=1, concurrency=1, heartbeat_at=stalled)
    Worker.objects.create(id="gone", hostname="h", pid=2, concurrency=1, heartbeat_at=stalled)
    Echo.dispatch_many([["peer"], ["gone"]])
    [peer_job] = engine.claim("peer", "echo", 1)
    [gone_job] = engine.claim("gone", "echo", 1)

    me = Lifeline(get_engine("default"), "me")
    now = time.monotonic()
    me.last_beat = now - 10 * conf.heartbeat_timeout()  # we were stalled too
    assert me.may_rescue(now) is False
    assert me.may_rescue(now + conf.heartbeat_interval()) is False

    assert engine.heartbeat("peer")  # the peer is back within the grace; "gone" is not
    assert me.may_rescue(now + 2 * conf.heartbeat_interval()) is True
    me.rescue()
    states = dict(Job.objects.filter(pk__in=[peer_job.id, gone_job.id]).values_list("pk", "state"))
    assert states == {peer_job.id: JobState.RUNNING, gone_job.id: JobState.WAITING}


def test_a_worker_that_heartbeats_on_time_judges_others_at_once():
    from django_gator import conf

    me = Lifeline(get_engine("default"), "me")
    now = time.monotonic()
    me.last_beat = now - conf.heartbeat_interval()
    assert me.may_rescue(now) is True


def test_each_heartbeat_settles_expired_jobs_and_a_failed_sweep_is_only_logged(monkeypatch, caplog):
    from django_gator import expiry
    from django_gator.dbtime import DbNow
    from django_gator.models import Worker

    engine = get_engine("default")
    Worker.objects.create(id="me", hostname="h", pid=1, concurrency=1, heartbeat_at=timezone.now())
    me = Lifeline(engine, "me")
    [job] = Echo.dispatch_many([["late"]], expires_at=timezone.now() + timedelta(hours=1))
    Job.objects.filter(pk=job.pk).update(expires_at=DbNow())
    me.beat()
    job.refresh_from_db()
    assert (job.state, job.error_class) == (JobState.CANCELLED, expiry.EXPIRED_CLASS)

    def broken(alias: str) -> int:
        raise RuntimeError("the sweep broke")

    monkeypatch.setattr("django_gator.worker.lifeline.settle_expired", broken)
    me.beat()  # the heartbeat itself is written; the sweep's error is logged
    assert "Expiry sweep failed worker=me" in caplog.text
    assert Worker.objects.get(id="me").heartbeat_at is not None
