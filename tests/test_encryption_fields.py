"""``encrypted = ["email", ...]``: only the listed keyword arguments are sealed (each in an
envelope of its own), the other arguments stay in clear; the worker, the admin and key
rotation open and re-seal them one by one."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.urls import reverse

from django_gator import Queueable, encryption
from django_gator.models import Job, JobState
from django_gator.testing import run_jobs
from tests.admin_helpers import operator
from tests.settings import TEST_KEY_A, TEST_KEY_B
from tests.testapp.jobs import SecretFields
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

EMAIL = "alice@example.com"
KEY_A = encryption.key_id(TEST_KEY_A)
KEY_B = encryption.key_id(TEST_KEY_B)


def raw_kwargs(pk: int) -> tuple[Any, Any, str]:
    """(args, kwargs, result) as the database holds them, read with a raw cursor."""
    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT args, kwargs, result FROM {table} WHERE id = %s", [pk])
        args, kwargs, result = cursor.fetchone()
    load = lambda v: json.loads(v) if isinstance(v, str) else v  # noqa: E731
    return load(args), load(kwargs), "" if result is None else str(result)


def test_only_the_listed_kwargs_are_sealed_and_the_handler_sees_them_plain():
    job = SecretFields.dispatch(7, email=EMAIL, note="welcome")
    args, kwargs, _ = raw_kwargs(job.pk)
    assert args == [7]
    assert kwargs["note"] == "welcome"
    assert set(kwargs["email"]) == {encryption.MARK, "data"}
    assert kwargs["email"][encryption.MARK] == KEY_A
    assert EMAIL not in json.dumps(kwargs)

    run_jobs()

    assert Execution.objects.get(job_id=job.pk).label == EMAIL
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED
    _, _, result = raw_kwargs(job.pk)
    assert EMAIL not in result  # the result is sealed, as for encrypted = True


def test_a_listed_argument_passed_by_position_is_refused():
    with pytest.raises(
        TypeError, match=r"SecretFields\.encrypted lists 'email': pass it by keyword"
    ):
        SecretFields.dispatch(7, EMAIL)
    assert not Job.objects.filter(name=SecretFields.name).exists()


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ("email", TypeError, r"Bad\.encrypted must be True, False or a non-empty list.*'email'"),
        ([], TypeError, r"Bad\.encrypted must be True, False or a non-empty list.*\[\]"),
        ([3], TypeError, r"Bad\.encrypted lists 3, which is not an argument name"),
        (["phone"], ValueError, r"Bad\.encrypted lists 'phone', which is not an argument of"),
        (["email", "email"], ValueError, r"Bad\.encrypted lists an argument twice"),
    ],
)
def test_a_bad_list_is_refused_when_the_class_is_defined(value, error, message):
    with pytest.raises(error, match=message):

        class Bad(Queueable):
            name = "tests.fields.Bad"
            encrypted = value

            def handle(self, email: str = "") -> None:
                return None


def test_rotation_reseals_each_listed_kwarg_and_the_job_runs_with_the_new_key_alone():
    job = SecretFields.dispatch(8, email=EMAIL)
    with override_settings(GATOR_ENCRYPTION_KEYS=[TEST_KEY_B, TEST_KEY_A]):
        out = StringIO()
        call_command("gator_rotate_keys", stdout=out)
        assert f"re-encrypted with key id {KEY_B}: 1" in out.getvalue()
    _, kwargs, _ = raw_kwargs(job.pk)
    assert kwargs["email"][encryption.MARK] == KEY_B
    with override_settings(GATOR_ENCRYPTION_KEYS=[TEST_KEY_B]):
        run_jobs()
    assert Execution.objects.get(job_id=job.pk).label == EMAIL


def test_the_admin_shows_the_clear_arguments_and_hides_the_listed_ones():
    job = SecretFields.dispatch(9, email=EMAIL, note="visible note")
    page = reverse("admin:django_gator_job_change", args=[job.pk])

    hidden = operator().get(page).content.decode()
    assert EMAIL not in hidden
    assert "visible note" in hidden
    assert "[encrypted]" in hidden

    shown = operator("view_encrypted", name="reader").get(page).content.decode()
    assert EMAIL in shown
