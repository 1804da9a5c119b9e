"""The contract's worker rows, heartbeats and rescue."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from django_gator.attempts import Mark
from django_gator.engines import get_engine
from django_gator.models import Job, JobState, Worker
from django_gator.rows import LostClaim
from tests.engines.conformance import covers, statements
from tests.testapp.jobs import Echo

pytestmark = pytest.mark.django_db(transaction=True)


def _register(engine, worker_id: str, **options) -> None:
    engine.register_worker(worker_id, "host-1", 4242, '[["echo", 1]]', 4, **options)


def _lapse(worker_id: str) -> None:
    Worker.objects.filter(pk=worker_id).update(
        heartbeat_at=get_engine("default").db_now() - timedelta(hours=1)
    )


@covers("register_worker", "heartbeat", "unregister_worker")
def test_a_worker_row_lives_from_register_to_unregister_and_its_heartbeat_says_if_it_is_there():
    engine = get_engine("default")
    with statements() as sent:
        _register(engine, "worker-a", supervisor="sup-1", wakeup_address="127.0.0.1:9")
    assert len(sent) == 1
    row = Worker.objects.get(pk="worker-a")
    assert (row.hostname, row.pid, row.concurrency, row.supervisor) == ("host-1", 4242, 4, "sup-1")
    assert row.wakeup_address == "127.0.0.1:9"
    _lapse("worker-a")

    with statements() as sent:
        assert engine.heartbeat("worker-a") is True
    assert len(sent) == 1
    assert Worker.objects.get(pk="worker-a").heartbeat_at > engine.db_now() - timedelta(minutes=1)

    engine.unregister_worker("worker-a")
    assert not Worker.objects.exists()
    assert engine.heartbeat("worker-a") is False  # declared lost: its row is gone


@covers("wakeup_targets", "lapsed_workers", "forget_workers")
def test_the_worker_table_reads_tell_live_from_lapsed_workers():
    engine = get_engine("default")
    _register(engine, "live", wakeup_address="10.0.0.1:7000")
    _register(engine, "quiet")  # no wakeup address
    _register(engine, "gone", wakeup_address="10.0.0.2:7000")
    _register(engine, "gone-too")
    _lapse("gone")
    _lapse("gone-too")
    cutoff = engine.db_now() - timedelta(minutes=5)

    assert engine.wakeup_targets(cutoff) == [("host-1", '[["echo", 1]]', "10.0.0.1:7000")]
    lapsed = engine.lapsed_workers(cutoff)
    assert sorted(w[0] for w in lapsed) == ["gone", "gone-too"]
    assert all(w[1:3] == ("host-1", 4242) and w[3].tzinfo is not None for w in lapsed)

    assert engine.forget_workers(cutoff, only=["gone"]) == 1
    assert engine.forget_workers(cutoff) == 1
    assert sorted(Worker.objects.values_list("id", flat=True)) == ["live", "quiet"]


@covers("lost_claims")
def test_lost_claims_reads_no_job_while_every_worker_is_alive():
    engine = get_engine("default")
    _register(engine, "worker-a")
    Echo.dispatch("running")
    engine.claim_and_mark("worker-a", "echo", 1, [])
    cutoff = engine.db_now() - timedelta(minutes=5)

    with statements() as sent:
        assert engine.lost_claims(cutoff) == []
    assert len(sent) == 1
    assert "django_gator_job" not in sent[0]

    _lapse("worker-a")
    [lost] = engine.lost_claims(cutoff)
    assert (lost.owner, lost.attempts, lost.isolated) == ("worker-a", 1, False)
    engine.unregister_worker("worker-a")
    assert engine.lost_claims(cutoff) == []  # no row: only the sweep finds it
    assert [c.id for c in engine.lost_claims(cutoff, sweep=True)] == [lost.id]


@covers("rescue")
def test_a_rescue_is_refused_when_the_worker_came_back_or_the_claim_changed():
    engine = get_engine("default")
    _register(engine, "worker-a")
    job = Echo.dispatch("lost")
    engine.claim_and_mark("worker-a", "echo", 1, [])
    _lapse("worker-a")
    cutoff = engine.db_now() - timedelta(minutes=5)
    [lost] = engine.lost_claims(cutoff)

    engine.heartbeat("worker-a")  # back between the read and the write: keeps its job
    assert engine.rescue(lost, cutoff, dead=False, error="{}", last_error="lost") is False
    stale = LostClaim(lost.id, lost.attempts + 1, lost.owner, 0, False, 0)
    _lapse("worker-a")
    assert engine.rescue(stale, cutoff, dead=False, error="{}", last_error="lost") is False
    assert engine.claim_state(job.pk) == ("running", 1, "worker-a")

    assert engine.rescue(lost, cutoff, dead=False, error='{"lost": 1}', last_error="lost") is True
    job.refresh_from_db()
    assert (job.state, job.suspect, job.rescues, job.last_error) == (
        JobState.WAITING,
        True,
        1,
        "lost",
    )
    # The lost worker's late success is refused: the job is no longer its.
    assert engine.mark_succeeded("worker-a", [Mark(job.pk, 1, None)]) == []


@covers("workers_share_a_host", "shared_memory_file")
def test_only_sqlite_workers_share_a_host_and_its_memory_file():
    engine = get_engine("default")
    if connection.vendor == "sqlite":
        assert engine.workers_share_a_host is True
        assert engine.shared_memory_file() == f"{connection.settings_dict['NAME']}-shm"
    else:
        assert engine.workers_share_a_host is False
        assert engine.shared_memory_file() is None
    assert Job.objects.count() == 0
