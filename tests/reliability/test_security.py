"""Security scenarios of RELIABILITY.md that other files do not cover: tampered job names
met by a worker, log injection, secrets in log lines and command output, forged or
unpermitted admin requests and HTML in admin pages.

The rest of the scenarios are tested where their feature is: see the mapping in
tests/test_registry.py, tests/reliability/test_faults.py and tests/test_admin_*.py.
"""

from __future__ import annotations

import importlib
import io
import logging
import re
import sys
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.db import DataError, connection, transaction
from django.test import Client
from django.urls import reverse

from django_gator import Queueable, Retry
from django_gator.models import Job, JobState, Schedule
from tests.conftest import SECRET, run_worker, worker_output
from tests.factories import JobFactory
from tests.testapp.jobs import Boom, Echo, FailsFirstTime, Noop

pytestmark = pytest.mark.django_db(transaction=True)

NOT_REGISTERED = "django_gator.exceptions.JobNotRegistered"
#: What a log record must never carry raw: line breaks (\n, \r, NEL, the Unicode line and
#: paragraph separators) and terminal escapes (ESC, CSI, BEL).
RAW_CONTROL = re.compile("[\n\r\x1b\x07\x85\x9b\u2028\u2029]")
#: An argument value named by GATOR_REDACT ("api_key"), nested in a dict.
API_KEY = "ak-live-4f9b2c7e1d"


def gator_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("django_gator")]


def formatted(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Each django_gator record as a handler writes it (message, and traceback if any)."""
    formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")
    return [formatter.format(r) for r in gator_records(caplog)]


# -- tampered job names, met by a worker ------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "os.system",
        "subprocess.run",
        "builtins.eval",
        "django_gator.jobfunction.FunctionJob",
        "tests.testapp.jobs",
        "tests.testapp.jobs.Echo\nINFO forged log line",
        "x\rINFO forged",
        "\x1b[2J\x1b[31mtests.testapp.jobs.Echo",
        "x\u2028forged",
        " tests.testapp.jobs.Echo",
        "n" * 255,
    ],
    ids=[
        "os.system",
        "subprocess",
        "eval",
        "abstract",
        "module",
        "newline",
        "carriage-return",
        "ansi",
        "line-separator",
        "space-prefix",
        "longest-column",
    ],
)
def test_a_worker_sends_a_row_with_a_tampered_name_to_dead_naming_it(name, caplog):
    bad = JobFactory(name=name, args=["echo pwned"])
    fine = Echo.dispatch("fine")

    with caplog.at_level(logging.INFO, logger="django_gator"):
        run_worker()

    bad.refresh_from_db()
    assert bad.state == JobState.DEAD
    assert bad.attempts == 1
    assert bad.last_error.startswith(f"{NOT_REGISTERED}: job name {name!r} is not registered")
    assert [e["class"] for e in bad.errors] == [NOT_REGISTERED]
    assert Job.objects.get(pk=fine.pk).state == JobState.SUCCEEDED
    # The worker's line about it names the row, escaped.
    lines = [m for m in (r.getMessage() for r in gator_records(caplog)) if f"id={bad.pk} " in m]
    assert len(lines) == 1
    assert "result=dead" in lines[0]
    assert not RAW_CONTROL.search(lines[0])


def test_names_too_long_for_the_column_are_refused_or_end_dead():
    """A 10 kB name: PostgreSQL and MySQL refuse the row; SQLite stores it (it does not
    enforce varchar lengths), and the worker sends it to dead naming it."""
    name = "os.system." + "x" * 10_000
    if connection.vendor == "sqlite":
        bad = JobFactory(name=name)
        run_worker()
        bad.refresh_from_db()
        assert bad.state == JobState.DEAD
        assert bad.last_error.startswith(f"{NOT_REGISTERED}: job name 'os.system.xxxx")
        assert bad.errors[0]["class"] == NOT_REGISTERED
        assert bad.errors[0]["message"].startswith("job name 'os.system.xxxx")
    else:
        with pytest.raises(DataError), transaction.atomic():
            JobFactory(name=name)
        assert not Job.objects.exists()


def test_a_worker_never_imports_a_module_named_by_a_row(booby_trapped_module):
    module, marker = booby_trapped_module
    names = [module, f"{module}.Job", f"{module}:Job", f"{module}.run", f"{module}.Job.handle"]
    rows = [JobFactory(name=name, args=["rm -rf /"]) for name in names]

    run_worker()

    for row, name in zip(rows, names, strict=True):
        row.refresh_from_db()
        assert row.state == JobState.DEAD, name
        assert f"job name {name!r} is not registered" in row.last_error
    assert module not in sys.modules
    assert not marker.exists()
    # The trap works: importing the module does leave the marker.
    importlib.import_module(module)
    assert marker.read_text() == "imported"


# -- log injection ----------------------------------------------------------------------------


def _rows_with_control_characters() -> dict[str, Job]:
    return {
        "name": JobFactory(
            name="x\nINFO forged name line \x1b[2J",
            args=["a\nINFO forged arg line", "\x1b[31mred"],
            kwargs={"k": "\r\nINFO forged kwarg line\x1b]0;title\x07"},
        ),
        "args": JobFactory(name=Echo.name, args={"not": "a list\nINFO forged args line\x1b[2J"}),
        "error": Boom.dispatch("boom\nINFO forged error line \x1b[31mred\u2028x\x85y"),
        "echo": Echo.dispatch("e\nINFO forged echo line", key="\x1b[2J"),
    }


def test_control_characters_in_names_args_and_errors_never_forge_a_log_line(caplog):
    rows = _rows_with_control_characters()

    with caplog.at_level(logging.DEBUG, logger="django_gator"):
        run_worker()

    texts = formatted(caplog)
    assert texts
    for text in texts:
        assert not RAW_CONTROL.search(text), text
    joined = "\n".join(texts)
    assert not any(line.startswith("INFO forged") for line in joined.split("\n"))
    # The payloads did reach the log, escaped (so the checks above did look at them).
    assert "name=x\\nINFO forged name line \\x1b[2J " in joined
    assert "INFO forged args line\\x1b[2J" in joined
    assert "boom\\nINFO forged error line \\x1b[31mred\\u2028x\\x85y" in joined
    states = {key: Job.objects.get(pk=row.pk).state for key, row in rows.items()}
    assert states == {
        "name": JobState.DEAD,
        "args": JobState.DEAD,
        "error": JobState.DEAD,
        "echo": JobState.SUCCEEDED,
    }


def test_a_worker_process_writes_one_line_per_record(spawn_worker):
    _rows_with_control_characters()

    proc = spawn_worker("--burst", "-v", "2", env={"GATOR_LOG_LEVEL": "DEBUG"})

    assert proc.wait(timeout=120) == 0, worker_output(proc)
    out = worker_output(proc)
    assert not re.search("[\r\x1b\x07\x85\x9b\u2028\u2029]", out), out
    lines = out.split("\n")
    forged = [line for line in lines if "forged" in line]
    assert len(forged) == 3, out  # the name, args and error rows; echo succeeds quietly
    assert all(line.startswith("Processed job id=") for line in forged), out
    assert "name=x\\nINFO forged name line \\x1b[2J " in out


def test_a_tampered_queue_name_never_forges_a_log_line(caplog):
    # The database accepts any non-empty queue; dispatch() would refuse this one.
    JobFactory(name=Echo.name, queue="q\nINFO forged queue line\x1b[2J")

    with caplog.at_level(logging.DEBUG, logger="django_gator"):
        run_worker()  # all queues

    assert Job.objects.get().state == JobState.SUCCEEDED
    for text in formatted(caplog):
        assert not RAW_CONTROL.search(text), text


def test_a_tampered_queue_name_never_forges_a_line_of_gator_status():
    JobFactory(name=Echo.name, queue="q\nforged status line\x1b[31m")
    out = io.StringIO()
    call_command("gator_status", stdout=out)
    text = out.getvalue()
    assert "forged status line" in text
    assert not RAW_CONTROL.search(text.replace("\n", "")), text
    assert not any(line.startswith("forged") for line in text.split("\n")), text


class HookLeaks(Queueable):
    """Its on_error() and retry_decision() raise with the secret and control characters
    in their messages."""

    def handle(self, password: str = "") -> None:
        raise RuntimeError("first")

    def on_error(self, exc: BaseException) -> None:
        raise ValueError(f"cleanup failed for {self.kwargs['password']}\nINFO forged\x1b[2J")

    def retry_decision(self, exc: BaseException, retry_count: int) -> Any:
        raise KeyError(f"no decision for {self.kwargs['password']}\nINFO forged\x1b[2J")


def test_tracebacks_of_failing_hooks_are_masked_and_escaped(caplog):
    HookLeaks.dispatch(password=SECRET)
    with caplog.at_level(logging.DEBUG, logger="django_gator"):
        run_worker()
    hooks = [r for r in caplog.records if "raised" in r.getMessage()]
    assert len(hooks) == 2, [r.getMessage() for r in caplog.records]
    for text in formatted(caplog):
        assert SECRET not in text, text
        assert not RAW_CONTROL.search(text), text
    assert any("ValueError: cleanup failed for" in r.getMessage() for r in hooks)


# -- secrets in log lines and command output ----------------------------------------------------


class LeaksSecrets(Queueable):
    """Fails once (retried), then for good, with its secrets in the error message."""

    retry = Retry(interval=0, max_retries=1)

    def handle(self, account: str, password: str = "", **options: Any) -> None:
        raise PermissionError(
            f"login failed for {account} with password {password} and options {options}"
        )


def test_secrets_never_reach_the_worker_log_even_at_debug(caplog):
    leaky = LeaksSecrets.dispatch("frank", SECRET, creds={"api_key": API_KEY, "user": "frank"})
    login = FailsFirstTime.dispatch("grace", "pin-1357", SECRET)  # positional pin and password

    with caplog.at_level(logging.DEBUG):
        run_worker()

    leaky.refresh_from_db()
    login.refresh_from_db()
    assert (leaky.state, leaky.attempts, login.state) == (JobState.DEAD, 2, JobState.DEAD)
    # The secrets are in the rows (workers need them) and in the error the job raised...
    assert SECRET in leaky.last_error
    assert API_KEY in leaky.last_error
    assert "pin-1357" in login.last_error or SECRET in login.last_error
    # ... but not in any log line, of any logger, message or traceback.
    texts = [logging.Formatter("%(message)s").format(r) for r in caplog.records]
    for text in texts:
        assert SECRET not in text
        assert API_KEY not in text
        assert "pin-1357" not in text
    joined = "\n".join(texts)
    # The lines about both jobs are there, masked: once failed (retried), once dead.
    assert joined.count("login failed for frank with password [redacted]") == 2
    assert "'api_key': '[redacted]'" in joined
    assert "login failed for grace with password [redacted]" in joined


def test_secrets_never_reach_a_worker_process_log(spawn_worker):
    FailsFirstTime.dispatch("heidi", pin="pin-8642", password=SECRET)

    proc = spawn_worker("--burst", "-v", "3", env={"GATOR_LOG_LEVEL": "DEBUG"})

    assert proc.wait(timeout=120) == 0, worker_output(proc)
    out = worker_output(proc)
    assert "login failed for heidi with password [redacted]" in out
    assert SECRET not in out
    assert Job.objects.get().state == JobState.DEAD


def test_secrets_never_reach_the_output_of_the_commands():
    FailsFirstTime.dispatch("ivan", password=SECRET)
    LeaksSecrets.dispatch("judy", SECRET, creds={"api_key": API_KEY})
    run_worker()
    assert Job.objects.filter(state=JobState.DEAD).count() == 2

    outputs = []
    for args in (
        ["gator_status"],
        ["gator_status", "--json", "--exact"],
        ["gator_retry", "--all", "--dry-run"],
        ["gator_retry", "--error", "PermissionError", "--dry-run"],
        ["gator_retry", "--name", FailsFirstTime.name, "--name", LeaksSecrets.name],
    ):
        out, err = io.StringIO(), io.StringIO()
        call_command(*args, verbosity=3, stdout=out, stderr=err)
        outputs.append(out.getvalue() + err.getvalue())

    assert "retried 2 jobs" in outputs[-1]
    for text in outputs:
        assert SECRET not in text
        assert API_KEY not in text


# -- admin: permissions, forged requests, GET, escaping ---------------------------------------

CHANGELIST = "admin:django_gator_job_changelist"
DEAD = "admin:django_gator_job_dead"
SCHEDULES = "admin:django_gator_schedule_changelist"


def operator(*perms: str, name: str = "op", csrf: bool = False) -> Client:
    """A logged-in staff user with the view permissions and ``perms``; with ``csrf``, a
    client that checks CSRF tokens like a browser request would be checked."""
    user = User.objects.filter(username=name).first() or User.objects.create_user(
        name, password="pw", is_staff=True
    )
    for codename in ("view_job", "view_schedule", *perms):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def dead_job(**fields: Any) -> Job:
    return JobFactory(dead=True, name=Boom.name, args=["disk full"], **fields)


def snapshot() -> list[tuple[Any, ...]]:
    """Everything an admin change could touch."""
    return list(
        Job.objects.order_by("pk").values_list(
            "pk", "state", "queue", "args", "kwargs", "cancel_requested", "audit"
        )
    )


@pytest.mark.parametrize(
    ("action", "permission"),
    [
        ("retry_jobs", "retry_job"),
        ("cancel_jobs", "cancel_job"),
        ("delete_selected", "delete_job"),
    ],
)
def test_each_changelist_action_needs_its_own_permission(action, permission):
    jobs = [dead_job(), JobFactory(), JobFactory(failed=True, attempts=2)]
    before = snapshot()
    others = {"retry_job", "cancel_job", "delete_job"} - {permission}
    form = {"action": action, "_selected_action": [j.pk for j in jobs], "post": "yes"}

    response = operator(*others).post(reverse(CHANGELIST), form)

    assert response.status_code in (200, 302, 403)
    assert snapshot() == before
    # With the permission, the same request does change the jobs.
    operator(permission, name="allowed").post(reverse(CHANGELIST), form)
    assert snapshot() != before


@pytest.mark.parametrize("action", ["retry_jobs", "cancel_jobs", "delete_selected"])
def test_changelist_actions_refuse_a_forged_post_without_csrf_token(action):
    jobs = [dead_job(), JobFactory()]
    before = snapshot()
    client = operator("retry_job", "cancel_job", "delete_job", csrf=True)
    form = {"action": action, "_selected_action": [j.pk for j in jobs], "post": "yes"}

    assert client.post(reverse(CHANGELIST), form).status_code == 403
    assert snapshot() == before


@pytest.mark.parametrize("action", ["retry", "discard"])
def test_dead_screen_changes_refuse_a_forged_post_without_csrf_token(action):
    dead_job(queue="one")
    dead_job(queue="two")
    before = snapshot()
    client = operator("retry_job", "cancel_job", csrf=True)
    form = {"action": action, "state": "dead", "confirm": "yes", "target_queue": "elsewhere"}

    assert client.post(reverse(DEAD), form).status_code == 403
    assert snapshot() == before


def test_editing_arguments_needs_the_retry_permission_a_csrf_token_and_a_post():
    job = dead_job()
    url = reverse("admin:django_gator_job_edit_arguments", args=[job.pk])
    form = {"args": '["rm -rf /"]', "kwargs": "{}", "retry": "on"}
    before = snapshot()

    # Every permission but retry_job.
    assert operator("cancel_job", "delete_job").post(url, form).status_code == 403
    # retry_job, but no CSRF token.
    assert operator("retry_job", name="r", csrf=True).post(url, form).status_code == 403
    # retry_job, with the values in a GET.
    assert operator("retry_job", name="r2").get(url, form).status_code == 200
    assert snapshot() == before

    # The same POST, with permission and token (the test client's default), does change it.
    assert operator("retry_job", name="r3").post(url, form).status_code == 302
    job.refresh_from_db()
    assert (job.args, job.state) == (["rm -rf /"], JobState.WAITING)


def test_run_now_needs_its_permission_a_csrf_token_and_a_post():
    schedule = Schedule(name="nightly", job_name=Noop.name, cron="0 3 * * *")
    schedule.save()
    form = {"action": "run_now", "_selected_action": [schedule.pk]}

    operator("add_schedule", "change_schedule", "delete_schedule").post(reverse(SCHEDULES), form)
    forged = operator("run_schedule", name="runner", csrf=True).post(reverse(SCHEDULES), form)
    assert forged.status_code == 403
    operator("run_schedule", name="runner2").get(reverse(SCHEDULES), form)
    assert not Job.objects.exists()

    operator("run_schedule", name="runner3").post(reverse(SCHEDULES), form)
    assert Job.objects.get().name == Noop.name


def test_schedules_cannot_be_changed_or_deleted_without_permission():
    schedule = Schedule(name="nightly", job_name=Noop.name, cron="0 3 * * *")
    schedule.save()
    viewer = operator("run_schedule")
    change = reverse("admin:django_gator_schedule_change", args=[schedule.pk])
    delete = reverse("admin:django_gator_schedule_delete", args=[schedule.pk])
    data = {
        "name": "nightly",
        "job_name": Echo.name,
        "cron": "* * * * *",
        "timezone": "UTC",
        "args": "[]",
        "kwargs": "{}",
        "misfire": "once",
        "catch_up_limit": "100",
    }

    viewer.post(change, data)
    viewer.post(delete, {"post": "yes"})
    viewer.post(
        reverse(SCHEDULES),
        {"action": "delete_selected", "_selected_action": [schedule.pk], "post": "yes"},
    )

    assert Schedule.objects.get().job_name == Noop.name
    assert Schedule.objects.get().cron == "0 3 * * *"


HTML = "<script>alert(1)</script>"
HTML_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


def test_admin_pages_escape_html_in_names_queues_args_and_errors():
    """Rows written around dispatch() can hold HTML in any text column."""
    job = JobFactory(
        dead=True,
        name=f"x.{HTML}",
        queue=f"q{HTML}",
        args=[HTML],
        kwargs={HTML: HTML},
        last_error=f"RuntimeError: {HTML}",
        errors=[{"attempt": 1, "class": HTML, "message": HTML, "traceback": HTML}],
    )
    Schedule(name=f"s{HTML}", job_name=Noop.name, cron="0 3 * * *").save()
    client = operator("retry_job", "cancel_job")
    pages = {
        "dead screen": client.get(reverse(DEAD)),
        "dead screen confirm": client.post(reverse(DEAD), {"action": "retry", "state": "dead"}),
        "retry confirm": client.post(
            reverse(CHANGELIST), {"action": "retry_jobs", "_selected_action": [job.pk]}
        ),
        "cancel confirm": client.post(
            reverse(CHANGELIST), {"action": "cancel_jobs", "_selected_action": [job.pk]}
        ),
        "edit arguments": client.get(
            reverse("admin:django_gator_job_edit_arguments", args=[job.pk])
        ),
        "dashboard": client.get(reverse("admin:django_gator_job_dashboard")),
        "changelist": client.get(reverse(CHANGELIST)),
        "detail": client.get(reverse("admin:django_gator_job_change", args=[job.pk])),
        "schedules": client.get(reverse(SCHEDULES)),
    }
    for where, response in pages.items():
        assert response.status_code == 200, where
        body = response.content.decode()
        assert HTML not in body, where
        assert "alert(1)" in body, where  # shown, escaped
    assert HTML_ESCAPED in pages["dead screen"].content.decode()
    assert snapshot()[0][1] == JobState.DEAD  # the confirmation pages changed nothing


def test_confirmation_pages_and_the_dashboard_never_show_secrets():
    FailsFirstTime.dispatch("mallory", pin="pin-8642", password=SECRET)
    run_worker()
    job = Job.objects.get()
    client = operator("retry_job", "cancel_job")
    pages = [
        client.post(reverse(DEAD), {"action": "retry", "state": "dead"}),
        client.post(reverse(DEAD), {"action": "discard", "state": "dead"}),
        client.post(reverse(CHANGELIST), {"action": "retry_jobs", "_selected_action": [job.pk]}),
        client.get(reverse("admin:django_gator_job_dashboard")),
        client.get(reverse(CHANGELIST), {"q": "mallory"}),
        client.get(reverse(DEAD), {"state": "both"}),
    ]
    for response in pages:
        assert response.status_code == 200
        body = response.content.decode()
        assert SECRET not in body
        assert "pin-8642" not in body
    assert Job.objects.get().state == JobState.DEAD


def test_the_retry_button_of_a_job_page_needs_the_permission_a_csrf_token_and_a_post():
    job = dead_job()
    url = reverse("admin:django_gator_job_retry", args=[job.pk])
    detail = reverse("admin:django_gator_job_change", args=[job.pk])
    before = snapshot()

    # The button is on the page only for those who may retry.
    assert f'formaction="{url}"' not in operator("cancel_job").get(detail).content.decode()
    assert f'formaction="{url}"' in operator("retry_job", name="r0").get(detail).content.decode()
    # Every permission but retry_job.
    assert operator("cancel_job", "delete_job", name="x").post(url).status_code == 403
    # retry_job, but no CSRF token.
    assert operator("retry_job", name="r1", csrf=True).post(url).status_code == 403
    # retry_job, as a GET.
    assert operator("retry_job", name="r2").get(url).status_code == 405
    assert snapshot() == before

    # The same POST, with permission and token (the test client's default), retries it,
    # through the job list's retry action's code: the audit trail says who.
    response = operator("retry_job", name="r3").post(url, follow=True)
    assert response.redirect_chain == [(detail, 302)]
    assert "1 job(s) queued to run again." in response.content.decode()
    job.refresh_from_db()
    assert job.state == JobState.WAITING
    assert [(e["action"], e["by"]) for e in job.audit] == [("retry", "r3")]
    # A job that is not dead or failed is left alone, and the page says so.
    again = operator("retry_job", name="r4").post(url, follow=True).content.decode()
    assert "1 job(s) skipped" in again
    job.refresh_from_db()
    assert (job.state, len(job.audit)) == (JobState.WAITING, 1)
    missing = reverse("admin:django_gator_job_retry", args=[job.pk + 1000])
    assert operator("retry_job", name="r5").post(missing).status_code == 404
