"""The contract's batch operations, which the job verbs call in their own transaction."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_gator.attempts import Claim, Failure, Mark
from django_gator.engines import get_engine
from django_gator.models import Batch, Job
from django_gator.models.membership import Probe
from tests.engines.conformance import covers
from tests.testapp.jobs import Echo, Noop

pytestmark = pytest.mark.django_db(transaction=True)


def _batch(count: int, **callbacks: object) -> tuple[Batch, list[Job]]:
    with Batch(**callbacks) as batch:
        members = Echo.dispatch_many([[n] for n in range(count)])
    return batch, members


def _claim(worker: str = "worker-a") -> Claim:
    [job], _ = get_engine("default").claim_and_mark(worker, "echo", 1, [])
    return Claim(job.id, job.attempts, job.batch_id)


@covers("probe_batch")
def test_probe_batch_reads_its_members_under_the_lock_of_its_row():
    engine = get_engine("default")
    batch, _ = _batch(2)
    with transaction.atomic():
        assert engine.probe_batch(batch.pk) == Probe(
            closed=True, active=True, dead=None, cancelled=None
        )
    dead = _claim()
    failure = Failure(dead=True, retry_in=None, queue="echo", error="{}", last_error="E: x")
    assert engine.mark_failed_and_insert("worker-a", dead, failure, [])
    with transaction.atomic():
        assert engine.probe_batch(batch.pk) == Probe(
            closed=True, active=True, dead=dead.id, cancelled=None
        )
        assert engine.probe_batch(batch.pk + 1000) is None


@covers("settle_now", "mark_succeeded")
def test_a_batch_is_settled_once_whoever_settles_it():
    engine = get_engine("default")
    batch, _ = _batch(2, on_complete=Noop)
    first, second = _claim(), _claim()
    # A mark without its batch id leaves the settling to the caller.
    assert len(engine.mark_succeeded("worker-a", [Mark(first.id, 1), Mark(second.id, 1)])) in (0, 2)
    assert not Job.objects.filter(queue="default").exists()

    with transaction.atomic():
        [callback] = engine.settle_now([batch.pk])
    assert Job.objects.get(pk=callback).args == [batch.pk]
    with transaction.atomic():
        assert engine.settle_now([batch.pk]) == []  # once


@covers("mark_succeeded")
def test_a_batch_members_mark_settles_its_batch_in_the_same_transaction():
    engine = get_engine("default")
    batch, _ = _batch(1, on_complete=Noop)
    member = _claim()
    assert engine.mark_succeeded("worker-a", [Mark(member.id, 1, None, member.batch_id)]) == [
        member.id
    ]
    [callback] = Job.objects.filter(queue="default")
    assert callback.args == [batch.pk]


@covers("reopen_batches")
def test_reopen_starts_a_new_generation_of_a_completed_batch():
    engine = get_engine("default")
    batch, _ = _batch(1, on_complete=Noop)
    member = _claim()
    engine.mark_succeeded("worker-a", [Mark(member.id, 1, None, member.batch_id)])
    batch.refresh_from_db()
    assert (batch.generation, batch.completed_generation) == (1, 1)

    with transaction.atomic():
        engine.reopen_batches([batch.pk])
        engine.reopen_batches([batch.pk])  # not completed since: unchanged
    batch.refresh_from_db()
    assert (batch.generation, batch.completed_generation, batch.completed_at) == (2, 1, None)
