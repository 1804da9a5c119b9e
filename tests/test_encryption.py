"""Encrypted jobs: ciphertext in the rows, plaintext only in the handler; a row that does
not decrypt fails clearly; key rotation while a worker runs loses nothing; the admin shows
the data only to users with ``django_gator.view_encrypted``."""

from __future__ import annotations

import json
import logging
import sys
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings
from django.urls import reverse

from django_gator import Chain, Workflow, encryption
from django_gator.checks import check_encryption
from django_gator.exceptions import EncryptionUnavailable
from django_gator.models import Job, JobState, WorkflowStep, sealing
from django_gator.testing import run_jobs
from tests.admin_helpers import operator
from tests.conftest import run_worker, wait_for, worker_output
from tests.settings import TEST_KEY_A, TEST_KEY_B
from tests.testapp.jobs import (
    Gathers,
    SecretAsync,
    SecretGathers,
    SecretIsolated,
    SecretLimited,
    SecretProduces,
    SecretRecord,
    SecretUnique,
)
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

CARD = "4111-1111-1111-1111"
KEY_A = encryption.key_id(TEST_KEY_A)
KEY_B = encryption.key_id(TEST_KEY_B)


def raw_row(pk: int) -> dict[str, str]:
    """The job's columns as the database holds them, read with a raw cursor."""
    columns = ["args", "kwargs", "result", "checkpoint_data", "errors", "last_error", "unique_key"]
    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(columns)} FROM {table} WHERE id = %s", [pk])
        row = cursor.fetchone()
    return {c: "" if v is None else str(v) for c, v in zip(columns, row, strict=True)}


def key_of(text: str) -> str:
    """The key id of the envelope stored as ``text``."""
    value = json.loads(text)
    assert set(value) == {encryption.MARK, "data"}, value
    return value[encryption.MARK]


def test_the_row_holds_ciphertext_and_the_handler_sees_plaintext(caplog):
    caplog.set_level(logging.DEBUG, logger="django_gator")
    job = SecretRecord.dispatch(CARD)

    stored = raw_row(job.pk)
    assert CARD not in json.dumps(stored)
    assert key_of(stored["args"]) == KEY_A
    assert key_of(stored["kwargs"]) == KEY_A

    run_jobs()

    assert Execution.objects.get(job_id=job.pk).label == CARD  # what handle() was given
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    stored = raw_row(job.pk)
    assert CARD not in json.dumps(stored)
    assert key_of(stored["result"]) == KEY_A
    assert key_of(stored["checkpoint_data"]) == KEY_A
    assert encryption.open_value(job.result, "result") == {"card": CARD}
    assert CARD not in caplog.text


def test_an_isolated_encrypted_job_sees_plaintext_and_its_row_keeps_ciphertext():
    job = SecretIsolated.dispatch(CARD)
    run_worker("secrets-isolated", concurrency=1)

    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED, (job.state, job.last_error)
    assert Execution.objects.get(job_id=job.pk).label == CARD  # what the child's handle() got
    stored = raw_row(job.pk)
    assert CARD not in json.dumps(stored)
    assert key_of(stored["result"]) == KEY_A
    assert key_of(stored["checkpoint_data"]) == KEY_A
    assert encryption.open_value(job.result, "result") == {"card": CARD}


def test_an_error_quoting_the_arguments_is_stored_encrypted_and_logged_without_them(caplog):
    caplog.set_level(logging.DEBUG, logger="django_gator")
    job = SecretRecord.dispatch(CARD, fail=True)

    with pytest.raises(ValueError, match="declined"):
        run_jobs()

    job.refresh_from_db()
    assert job.state == JobState.DEAD
    assert job.attempts == 2
    stored = raw_row(job.pk)
    assert CARD not in json.dumps(stored)
    assert job.last_error == "ValueError: [encrypted]"
    entry = job.errors[0]
    assert entry["class"] == "ValueError"
    assert encryption.open_value(entry["message"], "m") == f"card {CARD} was declined"
    assert CARD in encryption.open_value(entry["traceback"], "tb")
    # The second attempt resumed from the first one's checkpoint, decrypted.
    assert encryption.open_value(job.checkpoint_data, "c") == {
        "card": CARD,
        "seen": {"card": CARD, "seen": None},
    }
    assert "ValueError: [encrypted]" in caplog.text
    assert CARD not in caplog.text


def test_unique_keys_are_keyed_digests():
    first = SecretUnique.dispatch("ann@example.com")
    again = SecretUnique.dispatch(email="ann@example.com")
    other = SecretUnique.dispatch("bob@example.com")

    assert again.pk == first.pk
    assert other.pk != first.pk
    stored = raw_row(first.pk)
    assert stored["unique_key"].startswith(f"hmac:{KEY_A}:")
    assert "ann@example.com" not in json.dumps(stored)


def test_a_tampered_row_fails_clearly_and_never_runs():
    job = SecretRecord.dispatch(CARD)
    envelope = json.loads(raw_row(job.pk)["args"])
    data = envelope["data"]
    envelope["data"] = data[:40] + ("A" if data[40] != "A" else "B") + data[41:]
    Job.objects.filter(pk=job.pk).update(args=envelope)

    run_jobs(raise_errors=False)

    job.refresh_from_db()
    assert job.state == JobState.DEAD
    assert not Execution.objects.filter(job_id=job.pk).exists()
    assert f"job {job.pk} ({SecretRecord.name})" in job.last_error
    assert f"key id {KEY_A!r}" in job.last_error
    assert "ciphertext was changed" in job.last_error


def test_a_row_whose_key_was_removed_fails_naming_the_key():
    job = SecretRecord.dispatch(CARD)

    with override_settings(GATOR_ENCRYPTION_KEYS=[TEST_KEY_B]):
        run_jobs(raise_errors=False)

    job.refresh_from_db()
    assert job.state == JobState.DEAD
    assert not Execution.objects.filter(job_id=job.pk).exists()
    assert f"key id {KEY_A!r} is not in GATOR_ENCRYPTION_KEYS" in job.last_error
    assert CARD not in job.last_error

    # With the key back (after the newest), a retry runs it with its arguments.
    with override_settings(GATOR_ENCRYPTION_KEYS=[TEST_KEY_B, TEST_KEY_A]):
        call_command("gator_retry", "--error", "Undecryptable", stdout=StringIO())
        run_jobs()
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert Execution.objects.get(job_id=job.pk).label == CARD


@override_settings(GATOR_ENCRYPTION_KEYS=[])
def test_without_keys_dispatch_is_refused_and_the_check_says_why():
    with pytest.raises(EncryptionUnavailable, match="SecretRecord has encrypted = True, but"):
        SecretRecord.dispatch(CARD)
    assert not Job.objects.exists()
    [error] = check_encryption()
    assert error.id == "django_gator.E012"
    assert "GATOR_ENCRYPTION_KEYS is empty" in error.msg
    assert error.msg.startswith("job classes with encrypted = True (")
    assert "tests.testapp.jobs.Secret" in error.msg  # the first five are named


def test_without_the_cryptography_package_the_check_fails(monkeypatch):
    monkeypatch.setitem(sys.modules, "cryptography.fernet", None)  # import raises
    [error] = check_encryption()
    assert "cryptography package is not installed" in error.msg


@override_settings(GATOR_ENCRYPTION_KEYS=["not-a-key"])
def test_a_bad_key_is_named():
    [error] = check_encryption()
    assert "GATOR_ENCRYPTION_KEYS[0] is not URL-safe base64" in error.msg or (
        "GATOR_ENCRYPTION_KEYS[0] decodes to" in error.msg
    )


def test_rotation_reseals_rows_with_the_newest_key():
    ok = SecretRecord.dispatch(CARD)
    failed = SecretRecord.dispatch("5500-0000", fail=True)
    run_jobs(raise_errors=False)
    waiting = SecretRecord.dispatch("3400-0000")

    with override_settings(GATOR_ENCRYPTION_KEYS=[TEST_KEY_B, TEST_KEY_A]):
        out = StringIO()
        call_command("gator_rotate_keys", "--batch-size", "2", stdout=out)
        assert f"re-encrypted with key id {KEY_B}: 3" in out.getvalue()
        for job in (ok, failed, waiting):
            stored = raw_row(job.pk)
            for column in ("args", "kwargs"):
                assert key_of(stored[column]) == KEY_B
        failed.refresh_from_db()
        assert {e["message"][encryption.MARK] for e in failed.errors} == {KEY_B}
        assert key_of(raw_row(ok.pk)["result"]) == KEY_B
        # Once rotated, the old key can go.
    with override_settings(GATOR_ENCRYPTION_KEYS=[TEST_KEY_B]):
        run_jobs()
        assert Execution.objects.get(job_id=waiting.pk).label == "3400-0000"
        out = StringIO()
        call_command("gator_rotate_keys", stdout=out)
        assert f"re-encrypted with key id {KEY_B}: 0" in out.getvalue()


def test_rotation_reports_rows_it_cannot_decrypt():
    job = SecretRecord.dispatch(CARD)
    with override_settings(GATOR_ENCRYPTION_KEYS=[TEST_KEY_B]):
        err = StringIO()
        with pytest.raises(CommandError, match="1 row"):
            call_command("gator_rotate_keys", stdout=StringIO(), stderr=err)
    assert f"job {job.pk}:" in err.getvalue()
    assert KEY_A in err.getvalue()
    assert key_of(raw_row(job.pk)["args"]) == KEY_A  # left as it was


def test_rotation_while_a_worker_runs_loses_nothing(spawn_worker):
    # A colon is outside base64url, so no ciphertext can contain a card by chance.
    cards = [f"card:{i:04d}" for i in range(300)]
    jobs = SecretRecord.dispatch_many([[c] for c in cards])
    ids = [j.pk for j in jobs]
    proc = spawn_worker(
        "-q",
        "secrets",
        "--concurrency",
        "4",
        env={
            "GATOR_TEST_ENCRYPTION_KEYS": f"{TEST_KEY_B},{TEST_KEY_A}",
            "GATOR_LOG_LEVEL": "DEBUG",
        },
    )
    wait_for(lambda: Execution.objects.filter(job_id__in=ids).count() >= 20)

    with override_settings(GATOR_ENCRYPTION_KEYS=[TEST_KEY_B, TEST_KEY_A]):
        rotated = StringIO()
        call_command("gator_rotate_keys", "--batch-size", "25", stdout=rotated)
        assert "Rows examined: 300;" in rotated.getvalue()
        wait_for(
            lambda: Job.objects.filter(pk__in=ids, state=JobState.SUCCEEDED).count() == len(ids),
            timeout=120,
        )
        proc.terminate()
        assert proc.wait(30) == 0, worker_output(proc)
        logged = worker_output(proc)
        assert "Processed job" in logged
        assert "card:0" not in logged  # no card in the worker's log lines
        # Each job ran once, with its own card; every row is now under the new key.
        ran = dict(Execution.objects.filter(job_id__in=ids).values_list("job_id", "label"))
        assert ran == dict(zip(ids, cards, strict=True))
        assert Execution.objects.filter(job_id__in=ids).count() == len(ids)
        out = StringIO()
        call_command("gator_rotate_keys", stdout=out)
        assert f"re-encrypted with key id {KEY_B}: 0" in out.getvalue()
        for pk in ids:
            stored = raw_row(pk)
            assert {key_of(stored[c]) for c in ("args", "kwargs", "result")} == {KEY_B}
            assert key_of(stored["checkpoint_data"]) == KEY_B


def test_the_admin_hides_encrypted_data_without_the_permission():
    job = SecretRecord.dispatch(CARD, fail=True)
    run_jobs(raise_errors=False)
    page = reverse("admin:django_gator_job_change", args=[job.pk])

    hidden = operator().get(page).content.decode()
    assert CARD not in hidden
    assert "[encrypted]" in hidden

    shown = operator("view_encrypted", name="reader").get(page).content.decode()
    assert CARD in shown
    assert "was declined" in shown

    listing = operator(name="lister").get(reverse("admin:django_gator_job_changelist"))
    assert CARD not in listing.content.decode()
    search = operator(name="searcher").get(
        reverse("admin:django_gator_job_changelist"), {"q": CARD}
    )
    assert f">{job.pk}<" not in search.content.decode()


def test_the_admin_warns_when_a_value_cannot_be_decrypted():
    job = SecretRecord.dispatch(CARD)
    page = reverse("admin:django_gator_job_change", args=[job.pk])
    with override_settings(GATOR_ENCRYPTION_KEYS=[TEST_KEY_B]):
        html = operator("view_encrypted").get(page).content.decode()
    assert "[encrypted]" in html
    assert KEY_A in html
    assert "not in GATOR_ENCRYPTION_KEYS" in html


def test_workflow_steps_and_batch_members_are_sealed_and_hand_on_their_results():
    wf = Workflow(name="secret order")
    wf.add_batch(SecretProduces, [[f"{CARD}-{i}"] for i in range(3)], name="parts")
    first = wf.add(SecretProduces, CARD, name="one")
    wf.add(Gathers, after=["parts", first], name="plain")
    wf.add(SecretGathers, "x", after=["parts", first], name="sealed")
    wf.add_batch(SecretProduces, [["later-1"], ["later-2"]], after=["sealed"], name="late")
    run = wf.dispatch()
    step_rows = list(WorkflowStep.objects.filter(workflow=run).values_list("args", "members"))
    assert CARD not in json.dumps(step_rows)
    assert "later-1" not in json.dumps(step_rows)

    run_worker("results", concurrency=2)

    jobs = Job.objects.filter(chain_id=run.id)
    assert {j.state for j in jobs} == {JobState.SUCCEEDED}
    assert jobs.count() == 8
    for job in jobs.exclude(name=Gathers.name):
        stored = raw_row(job.pk)
        assert CARD not in json.dumps(stored)
        assert "later-" not in json.dumps(stored)
        assert key_of(stored["args"]) == KEY_A
    expected = {"parts": [f"{CARD}-{i}" for i in range(3)], "one": CARD}
    plain = jobs.get(name=Gathers.name)
    assert plain.result == {"results": expected, "extra": None}
    sealed = jobs.get(name=SecretGathers.name)
    assert encryption.open_value(sealed.result, "r") == {"results": expected, "extra": "x"}


def test_a_chain_of_encrypted_jobs_keeps_its_arguments_sealed():
    first = Chain(SecretProduces, SecretGathers).dispatch(CARD)

    run_worker("results")

    jobs = list(Job.objects.filter(chain_id=first.chain_id).order_by("chain_position"))
    assert [j.state for j in jobs] == [JobState.SUCCEEDED] * 2
    for job in jobs:
        assert CARD not in json.dumps(raw_row(job.pk))
    assert encryption.open_value(jobs[1].result, "r") == {"results": {"0": CARD}, "extra": CARD}


def test_an_async_encrypted_job_runs_on_the_loop_with_its_data_sealed():
    job = SecretAsync.dispatch(CARD)

    run_worker("aio", concurrency=1)

    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert CARD not in json.dumps(raw_row(job.pk))
    assert encryption.open_value(job.result, "r") == {"card": CARD}


def test_a_large_dispatch_many_is_sealed_row_by_row():
    # 1,200 rows: PostgreSQL sends them with COPY (from 1,000), the others in one INSERT.
    # A colon is outside base64url: a Fernet token once held "card-" by chance (CI, 2026-11-28).
    cards = [f"card:{i:05d}" for i in range(1200)]
    jobs = SecretRecord.dispatch_many([[c] for c in cards])

    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT args, kwargs FROM {table}")
        stored = [(str(a), str(k)) for a, k in cursor.fetchall()]
    assert len(stored) == len(cards)
    assert not [row for row in stored if "card:" in row[0] or "card:" in row[1]]
    assert {key_of(a) for a, _ in stored} == {KEY_A}
    tokens = {json.loads(a)["data"] for a, _ in stored}
    assert len(tokens) == len(cards)  # each row its own token
    opened = [encryption.open_value(j.args, "a") for j in Job.objects.order_by("pk")]
    assert opened == [[c] for c in cards]
    assert [j.args for j in jobs] == [[c] for c in cards]  # the caller's copies, in clear


def test_rotation_never_overwrites_what_a_worker_wrote_after_the_row_was_read():
    job = SecretRecord.dispatch(CARD)
    with override_settings(GATOR_ENCRYPTION_KEYS=[TEST_KEY_A]):
        Job.objects.filter(pk=job.pk).update(checkpoint_data=encryption.seal_value({"row": 1}))
    stale = Job.objects.filter(pk=job.pk).values(*sealing.READ).first()
    with override_settings(GATOR_ENCRYPTION_KEYS=[TEST_KEY_B, TEST_KEY_A]):
        # A worker (with the new key first) writes a newer checkpoint after that read.
        Job.objects.filter(pk=job.pk).update(checkpoint_data=encryption.seal_value({"row": 2}))
        report = sealing.Rotation(KEY_B)
        sealing._rotate_row(Job.objects, stale, encryption.keyring(), report)

        assert (report.reread, report.resealed) == (1, 1)
        job.refresh_from_db()
        assert encryption.open_value(job.checkpoint_data, "c") == {"row": 2}
        assert {key_of(raw_row(job.pk)[c]) for c in ("args", "kwargs", "checkpoint_data")} == {
            KEY_B
        }


def test_a_limited_encrypted_job_keeps_its_concurrency_key_as_returned():
    job = SecretLimited.dispatch(7, "ann@example.com")

    stored = raw_row(job.pk)
    assert "ann@example.com" not in json.dumps(stored)
    assert Job.objects.get(pk=job.pk).concurrency_key == "account:7"
    run_jobs()
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert encryption.open_value(job.result, "r") == "ann@example.com"


def test_rotation_digests_unique_keys_again_so_duplicates_are_still_found():
    first = SecretUnique.dispatch("ann@example.com")
    with override_settings(GATOR_ENCRYPTION_KEYS=[TEST_KEY_B, TEST_KEY_A]):
        call_command("gator_rotate_keys", stdout=StringIO())
        assert raw_row(first.pk)["unique_key"].startswith(f"hmac:{KEY_B}:")
        assert SecretUnique.dispatch(email="ann@example.com").pk == first.pk


def test_a_duplicate_dispatched_before_the_rotation_keeps_both_jobs():
    first = SecretUnique.dispatch("ann@example.com")
    with override_settings(GATOR_ENCRYPTION_KEYS=[TEST_KEY_B, TEST_KEY_A]):
        # The window: the new key digests differently, so the active job is not found.
        second = SecretUnique.dispatch("ann@example.com")
        assert second.pk != first.pk
        err = StringIO()
        call_command("gator_rotate_keys", stdout=StringIO(), stderr=err)
        assert "Unique keys left under the old key" in err.getvalue()
        assert str(first.pk) in err.getvalue()
        stored = raw_row(first.pk)
        assert stored["unique_key"].startswith(f"hmac:{KEY_A}:")
        assert key_of(stored["args"]) == KEY_B  # its data was re-sealed all the same
        assert raw_row(second.pk)["unique_key"].startswith(f"hmac:{KEY_B}:")


def test_wait_result_returns_the_decrypted_result_to_the_dispatching_code():
    job = SecretProduces.dispatch({"card": CARD})
    wf = Workflow(name="secret wait")
    wf.add(SecretProduces, CARD, name="one")
    wf.add_batch(SecretProduces, [["a"], ["b"]], name="many")
    run = wf.dispatch()

    run_worker("results")

    assert job.wait_result(timeout=30) == {"card": CARD}
    assert run.wait_result(timeout=30) == {"one": CARD, "many": ["a", "b"]}
