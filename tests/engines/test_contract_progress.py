"""The contract's statements of long-running jobs: progress and checkpoints written by a
compare-and-set on the claim, one statement each, and the checkpoint read back by id."""

from __future__ import annotations

import json

import pytest
from django.db import transaction

from django_gator.attempts import Claim
from django_gator.engines import get_engine
from django_gator.models import Job
from tests.engines.conformance import covers, statements, writes
from tests.testapp.jobs import Echo

pytestmark = pytest.mark.django_db(transaction=True)


def _claimed(worker: str = "w-1") -> Claim:
    job = Echo.dispatch("long")
    claimed = get_engine("default").claim_by_id(worker, job.pk)
    assert claimed is not None
    return Claim(job.pk, claimed.attempts)


@covers("save_progress")
def test_captured_logs_are_appended_per_attempt_with_the_progress_in_one_statement():
    engine = get_engine("default")
    claim = _claimed()
    first = json.dumps({"attempt": 1, "lines": ["a", "é"], "dropped": 0})
    with statements() as sent:
        assert engine.save_progress("w-1", claim, json.dumps({"done": 1}), None, first)
    assert len(writes(sent)) == 1
    assert engine.save_progress("w-1", claim, None, None, json.dumps({"attempt": 1, "lines": []}))
    assert not engine.save_progress("w-2", claim, None, None, json.dumps({"attempt": 9}))
    job = Job.objects.get(pk=claim.id)
    assert job.captured_logs == [
        {"attempt": 1, "lines": ["a", "é"], "dropped": 0},
        {"attempt": 1, "lines": []},
    ]
    assert job.progress == {"done": 1}


@covers("save_progress")
def test_progress_and_checkpoints_are_written_only_on_the_claim_in_one_statement():
    engine = get_engine("default")
    claim = _claimed()
    with statements() as sent:
        assert engine.save_progress("w-1", claim, json.dumps({"done": 1}), '{"row": 1}')
    assert len(writes(sent)) == 1
    # Another worker, or another attempt, writes nothing and says so.
    assert not engine.save_progress("w-2", claim, json.dumps({"done": 2}), '{"row": 2}')
    stale = Claim(claim.id, claim.attempts + 1)
    assert not engine.save_progress("w-1", stale, json.dumps({"done": 3}), None)
    job = Job.objects.get(pk=claim.id)
    assert job.progress == {"done": 1}
    assert job.checkpoint_data == {"row": 1}
    # None leaves a column as it is; nothing to write sends nothing.
    assert engine.save_progress("w-1", claim, json.dumps({"done": 4}), None)
    assert Job.objects.get(pk=claim.id).checkpoint_data == {"row": 1}
    with statements() as sent:
        assert not engine.save_progress("w-1", claim, None, None)
    assert sent == []
    # A finished job is no longer running: refused.
    Job.objects.filter(pk=claim.id).update(state="succeeded", finished_at=job.created_at)
    assert not engine.save_progress("w-1", claim, None, '{"row": 9}')
    assert Job.objects.get(pk=claim.id).checkpoint_data == {"row": 1}


@covers("save_progress")
def test_a_checkpoint_written_in_the_callers_transaction_rolls_back_with_it():
    engine = get_engine("default")
    claim = _claimed()

    def write_then_fail() -> None:
        with transaction.atomic():
            assert engine.save_progress("w-1", claim, None, '{"row": 5}')
            raise RuntimeError

    with pytest.raises(RuntimeError):
        write_then_fail()
    assert Job.objects.get(pk=claim.id).checkpoint_data is None


@covers("read_checkpoint")
def test_the_checkpoint_is_read_back_by_id_in_one_statement():
    engine = get_engine("default")
    claim = _claimed()
    assert engine.read_checkpoint(claim.id) is None
    engine.save_progress("w-1", claim, None, json.dumps({"row": 7, "name": "é"}))
    with statements() as sent:
        text = engine.read_checkpoint(claim.id)
    assert len(sent) == 1
    assert text is not None
    assert json.loads(text) == {"row": 7, "name": "é"}
    engine.save_progress("w-1", claim, None, "null")  # checkpoint(None)
    assert engine.read_checkpoint(claim.id) in (None, "null")
    assert engine.read_checkpoint(10**12) is None
