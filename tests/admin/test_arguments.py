"""Editing a dead job's arguments: validation, hidden values, the audit trail, undo."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from django_gator.models import JobState
from tests.admin_helpers import dead_jobs, operator
from tests.conftest import SECRET
from tests.testapp.jobs import Noop

pytestmark = pytest.mark.django_db(transaction=True)

DEAD = "admin:django_gator_job_dead"


def test_editing_a_dead_jobs_arguments_is_validated_recorded_and_keeps_hidden_values():
    groups = dead_jobs()
    job = next(j for j in groups["logins"] if j.args == ["alice"])
    url = reverse("admin:django_gator_job_edit_arguments", args=[job.pk])
    client = operator("retry_job")

    form = client.get(url).content.decode()
    assert SECRET not in form
    assert "pin-8642" not in form  # redacted by the class's own `redact`
    assert "[redacted]" in form

    bad = client.post(url, {"args": "[", "kwargs": "{}"}).content.decode()
    assert "args is not valid JSON" in bad
    bad = client.post(url, {"args": '["x"]', "kwargs": '{"nope": 1}'}).content.decode()
    assert "arguments do not fit handle()" in bad
    bad = client.post(url, {"args": '{"a": 1}', "kwargs": "{}"}).content.decode()
    assert "args must be a JSON list" in bad
    job.refresh_from_db()
    assert job.args == ["alice"]

    response = client.post(
        url,
        {
            "args": '["alice-renamed"]',
            "kwargs": '{"pin": "[redacted]", "password": "[redacted]"}',
            "retry": "on",
        },
    )
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.args == ["alice-renamed"]
    assert job.kwargs == {"pin": "pin-8642", "password": SECRET}  # the hidden values kept
    assert [e["action"] for e in job.audit] == ["edit_arguments", "retry"]
    assert job.state == JobState.WAITING


def test_only_dead_and_failed_jobs_can_be_edited():
    job = Noop.dispatch()
    client = operator("retry_job")
    url = reverse("admin:django_gator_job_edit_arguments", args=[job.pk])
    response = client.post(url, {"args": "[1]", "kwargs": "{}"}, follow=True)
    assert "only dead and failed jobs can be edited" in response.content.decode()
    assert operator(name="viewer").get(url).status_code == 403


def _audit_field(body: str) -> str:
    match = re.search(
        r'field-audit_html">.*?<div class="readonly">(.*?)</div>\s*</div>', body, re.S
    )
    assert match, body
    return match.group(1)


def test_an_argument_edit_keeps_the_values_before_and_after_shows_them_redacted_and_undoes():
    groups = dead_jobs()
    job = next(j for j in groups["logins"] if j.args == ["alice"])
    original = (job.args, job.kwargs)
    assert original == (["alice"], {"pin": "pin-8642", "password": SECRET})
    client = operator("retry_job")
    edit = reverse("admin:django_gator_job_edit_arguments", args=[job.pk])
    detail = reverse("admin:django_gator_job_change", args=[job.pk])

    response = client.post(
        edit,
        {"args": '["<i>alice</i>"]', "kwargs": '{"pin": "[redacted]", "password": "pw-new-4711"}'},
    )
    assert response.status_code == 302
    job.refresh_from_db()
    assert (job.args, job.kwargs) == (
        ["<i>alice</i>"],
        {"pin": "pin-8642", "password": "pw-new-4711"},
    )
    assert job.state == JobState.DEAD  # not retried: the box was not ticked
    [entry] = job.audit
    assert (entry["action"], entry["by"]) == ("edit_arguments", "op")
    assert entry["before"] == {"args": ["alice"], "kwargs": {"pin": "pin-8642", "password": SECRET}}
    assert entry["after"] == {"args": ["<i>alice</i>"], "kwargs": job.kwargs}

    page = client.get(detail).content.decode()
    audit = _audit_field(page)
    assert '<td><pre class="gator-json">[\n  &quot;alice&quot;\n]</pre></td>' in audit
    assert "&lt;i&gt;alice&lt;/i&gt;" in audit
    assert "<i>alice</i>" not in page
    assert audit.count("[redacted]") == 4  # pin and password, before and after
    for secret in (SECRET, "pin-8642", "pw-new-4711"):
        assert secret not in audit
    undo = f"{edit}?restore=0"
    assert f'href="{undo}"' in page
    assert "Undo the last argument edit" in page
    # The view-only page has neither the values' secrets nor the undo tool.
    viewer = operator(name="viewer").get(detail).content.decode()
    assert "Undo the last argument edit" not in viewer
    assert "pw-new-4711" not in viewer

    # A restore index that is not an edit with values is refused, and nothing changes.
    for bad in ("1", "9", "-1", "x"):
        response = client.post(edit, {"restore": bad, "args": "[]", "kwargs": "{}"})
        assert "nothing to restore" in response.content.decode(), bad
    job.refresh_from_db()
    assert len(job.audit) == 1
    assert job.args == ["<i>alice</i>"]

    # Undo: the editor shows the values from before the edit (masked), and saving them
    # restores them, hidden values included.
    form = client.get(undo).content.decode()
    assert "Restoring the arguments from before the edit by op" in form
    assert "&quot;alice&quot;" in form
    assert SECRET not in form
    response = client.post(
        edit,
        {
            "restore": "0",
            "args": '["alice"]',
            "kwargs": '{"pin": "[redacted]", "password": "[redacted]"}',
            "retry": "on",
        },
    )
    assert response.status_code == 302
    job.refresh_from_db()
    assert (job.args, job.kwargs) == original
    assert job.state == JobState.WAITING
    assert [e["action"] for e in job.audit] == ["edit_arguments", "edit_arguments", "retry"]
    assert job.audit[1]["before"] == entry["after"]
    assert job.audit[1]["after"] == {"args": original[0], "kwargs": original[1]}


def test_a_secret_replaced_by_an_argument_edit_stays_masked_in_the_errors_it_left():
    """The error history and the last error hold the password the job failed with; after an
    edit changed it, the pages must still mask it (the audit entry knows it)."""
    groups = dead_jobs()
    carol = next(j for j in groups["logins"] if j.args == ["carol"])  # her group's newest
    assert SECRET in carol.last_error
    assert SECRET in carol.errors[0]["traceback"] or SECRET in carol.errors[0]["message"]
    client = operator("retry_job")
    edit = reverse("admin:django_gator_job_edit_arguments", args=[carol.pk])
    client.post(edit, {"args": '["carol"]', "kwargs": '{"password": "pw-new-4711"}'})
    carol.refresh_from_db()
    assert carol.kwargs == {"password": "pw-new-4711"}

    pages = {
        "detail": client.get(reverse("admin:django_gator_job_change", args=[carol.pk])),
        "list": client.get(reverse("admin:django_gator_job_changelist")),
        "dead jobs": client.get(reverse(DEAD)),
        "editor": client.get(edit),
    }
    for where, response in pages.items():
        body = response.content.decode()
        assert SECRET not in body, where
        assert "pw-new-4711" not in body, where
    assert "login failed for carol with password [redacted]" in pages["detail"].content.decode()
