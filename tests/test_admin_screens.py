"""The dead-job screen, editing a dead job's arguments, the dashboard, and redaction of
secrets in admin pages and log lines."""

from __future__ import annotations

import logging
import re

import django
import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_gator.models import Job, JobState
from tests.conftest import SECRET, dead_jobs_for_operators, run_worker
from tests.testapp.jobs import Boom, FailsFirstTime, Noop

pytestmark = pytest.mark.django_db(transaction=True)

DEAD = "admin:django_gator_job_dead"


def operator(*perms: str, name: str = "op") -> Client:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    for codename in ("view_job", *perms):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


dead_jobs = dead_jobs_for_operators


def test_dead_jobs_are_grouped_by_name_and_error_class():
    dead_jobs()
    page = operator().get(reverse(DEAD)).content.decode()

    assert "5 jobs match" in page
    assert "PermissionError" in page
    assert "RuntimeError" in page
    assert page.count('class="gator-group"') == 2
    assert "disk full again" in page  # the newest message of its group
    assert SECRET not in page  # the password is in the error message, and masked
    assert "[redacted]" in page
    assert "Retry group" not in page  # no retry permission


def test_retrying_a_group_asks_first_then_runs_it_again_keeping_history():
    groups = dead_jobs()
    client = operator("retry_job")
    form = {
        "action": "retry",
        "state": "dead",
        "name": FailsFirstTime.name,
        "error_class": "PermissionError",
        "target_queue": "recovery",
    }

    confirm = client.post(reverse(DEAD), form)
    assert confirm.status_code == 200
    assert "Retry 3 jobs" in confirm.content.decode()
    assert Job.objects.filter(state=JobState.DEAD).count() == 5

    done = client.post(reverse(DEAD), {**form, "confirm": "yes"})
    assert done.status_code == 302
    logins = Job.objects.filter(pk__in=[j.pk for j in groups["logins"]])
    assert set(logins.values_list("state", "queue")) == {(JobState.WAITING, "recovery")}
    assert Job.objects.filter(name=Boom.name, state=JobState.DEAD).count() == 2

    run_worker("recovery")
    for job in logins:
        job.refresh_from_db()
        assert (job.state, job.attempts, job.result) == (
            JobState.SUCCEEDED,
            2,
            "ok on attempt 2",
        )
        assert len(job.errors) == 1  # the first attempt's error is kept
        assert job.audit == [
            {"at": job.audit[0]["at"], "by": "op", "action": "retry", "queue": "recovery"}
        ]


def test_retry_all_matching_and_discard_with_a_record_of_who():
    dead_jobs()
    client = operator("retry_job", "cancel_job")
    client.post(
        reverse(DEAD),
        {"action": "discard", "state": "dead", "name": Boom.name, "confirm": "yes"},
    )
    booms = Job.objects.filter(name=Boom.name)
    assert set(booms.values_list("state", flat=True)) == {JobState.CANCELLED}
    assert all(job.audit[-1]["action"] == "discard" for job in booms)
    assert all(job.audit[-1]["by"] == "op" for job in booms)

    client.post(reverse(DEAD), {"action": "retry", "state": "dead", "confirm": "yes"})
    assert Job.objects.filter(state=JobState.WAITING).count() == 3


def test_changes_need_their_permission_and_a_csrf_token():
    dead_jobs()
    form = {"action": "retry", "state": "dead", "confirm": "yes"}
    assert operator().post(reverse(DEAD), form).status_code == 403
    assert (
        operator("retry_job", name="op2")
        .post(reverse(DEAD), {**form, "action": "discard"})
        .status_code
        == 403
    )

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="op2"))
    assert strict.post(reverse(DEAD), form).status_code == 403
    assert Job.objects.filter(state=JobState.DEAD).count() == 5
    # GET never changes anything, whatever its parameters.
    operator("retry_job", name="op3").get(reverse(DEAD), form)
    assert Job.objects.filter(state=JobState.DEAD).count() == 5


def test_a_bad_target_queue_is_refused_with_its_name():
    dead_jobs()
    response = operator("retry_job").post(
        reverse(DEAD),
        {"action": "retry", "state": "dead", "target_queue": "no spaces", "confirm": "yes"},
        follow=True,
    )
    assert "queue name &#x27;no spaces&#x27;" in response.content.decode()
    assert Job.objects.filter(state=JobState.DEAD).count() == 5


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


def test_job_pages_mask_secrets_in_payload_and_errors(admin_client: Client):
    groups = dead_jobs()
    job = next(j for j in groups["logins"] if j.args == ["alice"])
    detail = admin_client.get(reverse("admin:django_gator_job_change", args=[job.pk]))
    listing = admin_client.get(reverse("admin:django_gator_job_changelist"))
    for page in (detail.content.decode(), listing.content.decode()):
        assert SECRET not in page
        assert "pin-8642" not in page
    assert "[redacted]" in detail.content.decode()


def test_worker_log_lines_mask_secrets(caplog):
    FailsFirstTime.dispatch("dave", password=SECRET)
    with caplog.at_level(logging.INFO):
        run_worker()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "login failed for dave" in text
    assert SECRET not in text


def test_the_changelist_searches_argument_text(admin_client: Client):
    dead_jobs()
    Noop.dispatch("needle-in-args")
    page = admin_client.get(
        reverse("admin:django_gator_job_changelist"), {"q": "needle-in"}
    ).content.decode()
    assert "1 result" in page or page.count('class="action-select"') == 1


def test_the_dashboard_shows_queues_throughput_and_workers(admin_client: Client):
    dead_jobs()
    Noop.dispatch()
    Noop.dispatch(wait=3600)
    page = admin_client.get(reverse("admin:django_gator_job_dashboard")).content.decode()
    assert 'id="gator-queues"' in page
    assert "<svg" in page
    assert "Last hour: 0 succeeded, 5 dead" in page
    assert "No live worker." in page
    assert "<script" not in page.split('id="content-main"')[1].split("</svg>")[0]


def test_the_edit_button_shows_only_to_users_who_may_retry():
    groups = dead_jobs()
    job = groups["logins"][0]
    url = reverse("admin:django_gator_job_change", args=[job.pk])
    assert "Edit arguments and retry" not in operator().get(url).content.decode()
    assert "Edit arguments and retry" in operator("retry_job", name="r").get(url).content.decode()


def test_the_dashboard_says_when_the_row_count_is_an_estimate(admin_client: Client):
    from django_gator.stats import estimated_total

    Noop.dispatch()
    total, exact = estimated_total()
    page = admin_client.get(reverse("admin:django_gator_job_dashboard")).content.decode()
    assert ("About" in page) is (not exact)
    assert f"{total} job rows" in page


def test_the_dead_job_screens_index_holds_only_dead_and_failed_rows():
    from django.db import connection

    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, Job._meta.db_table)
    if connection.vendor == "mysql":
        assert "gator_job_groups" not in constraints  # no partial indexes there
        return
    assert constraints["gator_job_groups"]["columns"] == ["state", "name", "error_class"]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_get_indexdef('gator_job_groups'::regclass)")
            definition = cursor.fetchone()[0]
        assert "WHERE" in definition
        assert "dead" in definition


def _breadcrumbs(html: str) -> str:
    """The breadcrumbs of an admin page, whitespace squeezed."""
    match = re.search(r'<nav aria-label="Breadcrumbs">(.*?)</nav>', html, re.S)
    assert match, html[:2000]
    return re.sub(r"\s+", " ", match.group(1)).strip()


def test_the_custom_pages_render_breadcrumbs_as_djangos_own_pages_do(admin_client: Client):
    groups = dead_jobs()
    job = groups["logins"][0]
    own = _breadcrumbs(
        admin_client.get(reverse("admin:django_gator_job_change", args=[job.pk])).content.decode()
    )
    if django.VERSION >= (6, 1):
        assert own.startswith('<ol class="breadcrumbs"> <li><a href="/admin/">Home</a></li>')
        assert own.endswith(f'<li aria-current="page">{job}</li> </ol>')
    else:
        assert own.startswith('<div class="breadcrumbs"> <a href="/admin/">Home</a> &rsaquo; ')
    dead = reverse(DEAD)
    pages = {
        "Dead jobs": admin_client.get(dead),
        "Dead jobs &rsaquo; Are you sure?": admin_client.post(
            dead, {"action": "retry", "state": "dead"}
        ),
        "Job dashboard": admin_client.get(reverse("admin:django_gator_job_dashboard")),
        f"{job} &rsaquo; Edit arguments": admin_client.get(
            reverse("admin:django_gator_job_edit_arguments", args=[job.pk])
        ),
        "Are you sure?": admin_client.post(
            reverse("admin:django_gator_job_changelist"),
            {"action": "retry_jobs", "_selected_action": [job.pk]},
        ),
    }
    for trail, response in pages.items():
        ours = _breadcrumbs(response.content.decode())
        texts = re.sub(r"<[^>]+>", "", ours.replace("</li> <li", "</li> &rsaquo; <li"))
        expected = f"Home &rsaquo; Background jobs &rsaquo; Jobs &rsaquo; {trail}"
        assert re.sub(r"\s+", " ", texts).strip() == expected, (trail, ours)
        if django.VERSION >= (6, 1):
            assert ours.startswith('<ol class="breadcrumbs"> <li><a href="/admin/">Home</a></li>')
            assert ours.count("<li") == expected.count("&rsaquo;") + 1, ours
            assert ours.endswith(
                f'<li aria-current="page">{trail.split(" &rsaquo; ")[-1]}</li> </ol>'
            )
            assert "&rsaquo;" not in ours  # the CSS draws the separators
        else:
            assert ours.startswith('<div class="breadcrumbs"> <a href="/admin/">Home</a> &rsaquo; ')
            assert "<li" not in ours


def test_the_workers_page_shows_queues_and_weights_readably(admin_client: Client):
    from tests.factories import WorkerFactory

    weighted = WorkerFactory(queues=[["critical", 8], ["default", 1], ["<b>x</b>", 2]])
    every = WorkerFactory(queues=[])
    listing = admin_client.get(reverse("admin:django_gator_worker_changelist")).content.decode()
    detail = admin_client.get(
        reverse("admin:django_gator_worker_change", args=[weighted.pk])
    ).content.decode()
    readable = "critical (weight 8), default (weight 1), &lt;b&gt;x&lt;/b&gt; (weight 2)"
    for page in (listing, detail):
        assert readable in page
        assert "[[" not in page
        assert "&quot;critical&quot;" not in page
        assert "<b>x</b>" not in page
    assert "all queues" in listing
    assert (
        "all queues"
        in admin_client.get(
            reverse("admin:django_gator_worker_change", args=[every.pk])
        ).content.decode()
    )
    # Times to the second, as on the job pages.
    assert f'<span class="nowrap">{every.heartbeat_at:%H:%M:%S}</span>' in listing


def test_the_dashboard_flags_a_queue_with_due_jobs_that_no_live_worker_serves(
    admin_client: Client,
):
    from tests.factories import JobFactory, WorkerFactory
    from tests.testapp.jobs import Echo

    Noop.dispatch()  # due now on "default"
    Echo.dispatch()  # due now on "echo"
    Noop.dispatch(queue="later", wait=3600)  # nothing due there yet
    WorkerFactory(queues=[["echo", 3]])  # live, serves echo only
    WorkerFactory(stale=True, queues=[])  # would serve every queue, but its heartbeat lapsed
    url = reverse("admin:django_gator_job_dashboard")

    def flagged() -> list[str]:
        page = admin_client.get(url).content.decode()
        rows = re.findall(r'<tr class="gator-unserved">\s*<td><a href="[^"]*">([^<]*)</a>', page)
        note = re.search(r'<p class="errornote gator-unserved-note">(.*?)</p>', page, re.S)
        assert bool(rows) == bool(note), page
        if note:
            assert "no live worker" in note.group(1)
            for queue in rows:
                assert f"<code>{queue}</code>" in note.group(1)
        return rows

    assert flagged() == ["default"]
    WorkerFactory(queues=[["default", 1], ["other", 2]])
    assert flagged() == []
    JobFactory(name=Echo.name, queue="<b>x</b>")  # dispatch() refuses the name; a row can hold it
    assert flagged() == ["&lt;b&gt;x&lt;/b&gt;"]
    WorkerFactory(queues=[])  # a worker started without -q serves every queue
    assert flagged() == []


def test_the_throughput_chart_has_a_legend_and_labelled_time_and_count_axes():
    from datetime import UTC, datetime, timedelta

    from django_gator.admin.chart import chart_svg

    start = datetime(2026, 5, 1, 12, 1, tzinfo=UTC)
    points = [
        {"minute": start + timedelta(minutes=i), "succeeded": i % 7, "dead": int(i == 30)}
        for i in range(60)
    ]
    svg = chart_svg(points)

    legend = re.search(r'<g class="gator-legend".*?</g>', svg, re.S)
    assert legend
    assert re.findall(r"<text[^>]*>([^<]*)</text>", legend.group(0)) == ["succeeded", "dead"]
    assert 'fill="#3a8c3a"' in legend.group(0)
    assert 'fill="#c0392b"' in legend.group(0)
    x_axis = re.search(r'<g class="gator-x-axis".*?</g>', svg, re.S)
    assert x_axis
    assert re.findall(r"<text[^>]*>([^<]*)</text>", x_axis.group(0)) == [
        "12:10",
        "12:20",
        "12:30",
        "12:40",
        "12:50",
        "13:00",
        "time (UTC)",
    ]
    y_axis = re.search(r'<g class="gator-y-axis".*?</g>', svg, re.S)
    assert y_axis
    assert re.findall(r"<text[^>]*>([^<]*)</text>", y_axis.group(0)) == ["0", "3", "6", "jobs/min"]
    # In the admin's time zone, as the job pages show times.
    from django.utils import timezone

    timezone.activate("Asia/Kolkata")  # UTC+05:30
    try:
        shifted = chart_svg(points)
    finally:
        timezone.deactivate()
    assert ">17:40<" in shifted
    assert ">time (IST)<" in shifted


def test_the_dashboard_chart_has_its_legend_and_axes(admin_client: Client):
    dead_jobs()
    page = admin_client.get(reverse("admin:django_gator_job_dashboard")).content.decode()
    svg = page.split('<svg xmlns="http://www.w3.org/2000/svg"')[1].split("</svg>")[0]
    assert 'class="gator-legend"' in svg
    assert "time (UTC)" in svg
    assert len(re.findall(r'<g class="gator-x-axis".*?</g>', svg, re.S)) == 1


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
