"""The system checks (django_gator/checks.py): every declared setting (E001-E003, W004),
the database (W001-W003, E004) and the schedules declared in code and settings (E005); and
that ``manage.py gator_worker`` refuses to start on a bad setting.

The bad values of each setting come from tests/test_conf.py (BAD), which fails when a
setting is declared without them. The admin's schedule form is tested in
tests/reliability/test_bad_input.py; the Tasks backend's check (E006) in
tests/tasks/test_backend.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core import checks
from django.db import connection, connections
from django.db.utils import ConnectionHandler
from django.test import override_settings
from django.utils import timezone

from django_gator import Cron, Queueable, conf
from django_gator import checks as gator_checks
from django_gator.engines import checks as engine_checks
from django_gator.models import Job, JobState
from django_gator.queueable import registered_jobs, unregister
from tests.conftest import ROOT, worker_output
from tests.test_conf import BAD_CASES
from tests.testapp.jobs import Noop

SCRATCH = "gator_scratch"


def messages_with(check_id: str, **kwargs: Any) -> list[checks.CheckMessage]:
    return [m for m in checks.run_checks(**kwargs) if m.id == check_id]


# -- settings -----------------------------------------------------------------------------------


def test_use_tz_false_is_an_error_naming_the_setting_and_the_fix():
    with override_settings(USE_TZ=False):
        found = messages_with("django_gator.E001")

    assert len(found) == 1
    assert isinstance(found[0], checks.Error)
    assert "USE_TZ is False" in found[0].msg
    assert "set USE_TZ = True" in (found[0].hint or "")
    assert not messages_with("django_gator.E001")


def test_an_unknown_gator_database_is_an_error_naming_it_and_the_choices():
    with override_settings(GATOR_DATABASE="jobsdb"):
        found = messages_with("django_gator.E002")

    assert len(found) == 1
    assert isinstance(found[0], checks.Error)
    assert "GATOR_DATABASE = 'jobsdb' is not a key of DATABASES" in found[0].msg
    assert "'default'" in (found[0].hint or "")
    assert not messages_with("django_gator.E002")


@pytest.mark.parametrize(
    ("setting", "option", "kind", "text"),
    [
        ("GATOR_POLL_INTERVAL", "--poll-interval", float, "0"),
        ("GATOR_POLL_INTERVAL", "--poll-interval", float, "0.0005"),
        ("GATOR_POLL_INTERVAL", "--poll-interval", float, "-1"),
        ("GATOR_POLL_INTERVAL", "--poll-interval", float, "inf"),
        ("GATOR_POLL_INTERVAL", "--poll-interval", float, "0.001"),
        ("GATOR_CONCURRENCY", "--concurrency", int, "0"),
        ("GATOR_CONCURRENCY", "--concurrency", int, "1"),
        ("GATOR_SHUTDOWN_TIMEOUT", "--shutdown-timeout", float, "-0.5"),
        ("GATOR_SHUTDOWN_TIMEOUT", "--shutdown-timeout", float, "0"),
    ],
)
def test_a_worker_option_and_its_setting_accept_the_same_values(setting, option, kind, text):
    # `--poll-interval 0` used to be accepted (an idle worker then spun at full CPU) while
    # GATOR_POLL_INTERVAL = 0 was refused by E003: both now validate with conf.RANGES.
    from django.core.management import CommandError, call_command

    value = kind(text)
    with override_settings(**{setting: value}):
        setting_errors = [m.msg for m in messages_with("django_gator.E003") if setting in m.msg]
    try:
        # Parsing only: an accepted value would start a worker, so stop right after argparse.
        call_command("gator_worker", option, text, "--help")
    except CommandError as exc:
        option_error: str | None = str(exc)
    except SystemExit:  # --help printed: the option was accepted
        option_error = None

    if setting_errors:
        assert option_error is not None, f"{option} {text} accepted, {setting} refused"
        assert f"got {text} (the range of {setting})" in option_error
        assert setting_errors == [
            f"{setting} must be at least {conf.RANGES[setting][0]}, got {value!r}."
        ]
    else:
        assert option_error is None, option_error


# -- databases: a real SQLite file with the settings under test --------------------------------


@pytest.fixture
def scratch_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, django_db_blocker: Any
) -> Iterator[Any]:
    """``scratch(options, name=None)``: a real SQLite database under the alias SCRATCH,
    with those OPTIONS, made GATOR_DATABASE; whatever database the suite runs on. (Not a
    django_db test: the test database is not touched, and a TestCase would refuse an alias
    it was not told about.)"""
    made: list[Any] = []

    def scratch(options: dict[str, Any], name: str | None = None) -> Any:
        config = {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": name or str(tmp_path / f"scratch-{len(made)}.sqlite3"),
            "OPTIONS": options,
        }
        wrapper = ConnectionHandler({"default": config, SCRATCH: config})[SCRATCH]
        monkeypatch.setitem(settings.DATABASES, SCRATCH, wrapper.settings_dict)
        connections[SCRATCH] = wrapper
        made.append(wrapper)
        return wrapper

    with override_settings(GATOR_DATABASE=SCRATCH), django_db_blocker.unblock():
        yield scratch
    for wrapper in made:
        wrapper.close()
    if made:
        del connections[SCRATCH]


def database_messages() -> dict[str, checks.CheckMessage]:
    """The SQLite settings checks of SCRATCH. (Its database is not migrated, so W003 is
    left out here; tests/test_schema.py tests it.)"""
    found = [
        m for m in gator_checks.check_database(databases=[SCRATCH]) if m.id != "django_gator.W003"
    ]
    assert len({m.id for m in found}) == len(found)
    return {m.id: m for m in found}


def test_sqlite_without_wal_or_immediate_transactions_is_reported_with_the_fix(scratch_sqlite):
    scratch_sqlite({})

    found = database_messages()

    assert set(found) == {"django_gator.W001", "django_gator.W002"}
    wal, immediate = found["django_gator.W001"], found["django_gator.W002"]
    assert f"SQLite database {SCRATCH!r} is in 'delete' journal mode, not WAL" in wal.msg
    assert '"init_command": "PRAGMA journal_mode=WAL;"' in (wal.hint or "")
    assert "does not use IMMEDIATE transactions (OPTIONS has no transaction_mode)" in (
        immediate.msg
    )
    assert '"transaction_mode": "IMMEDIATE"' in (immediate.hint or "")


def test_sqlite_with_deferred_transactions_is_reported_naming_the_mode(scratch_sqlite):
    scratch_sqlite({"init_command": "PRAGMA journal_mode=WAL;", "transaction_mode": "DEFERRED"})

    found = database_messages()

    assert set(found) == {"django_gator.W002"}
    assert "(OPTIONS has 'DEFERRED')" in found["django_gator.W002"].msg


def test_sqlite_in_wal_mode_with_immediate_transactions_passes(scratch_sqlite):
    scratch_sqlite({"init_command": "PRAGMA journal_mode=WAL;", "transaction_mode": "immediate"})
    assert database_messages() == {}


def test_an_in_memory_sqlite_database_is_not_checked(scratch_sqlite):
    # One process, so nothing to block: no WAL (which :memory: cannot have) asked for.
    scratch_sqlite({}, name=":memory:")
    assert database_messages() == {}


README_SETTINGS = """
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "readme-project"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_gator"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": BASE_DIR / "db.sqlite3",
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL;",
            "timeout": 20,
        },
    }
}
"""

README_PROJECT_TEST = """
from django.test import TestCase

from django_gator.models import Job


class JobTableTests(TestCase):
    def test_no_jobs(self):
        self.assertEqual(Job.objects.count(), 0)
"""


def test_manage_py_test_with_the_readme_settings_shows_no_gator_warning(tmp_path):
    # The README's SQLite settings give `manage.py test` an in-memory test database
    # ("file:memorydb_default?mode=memory&cache=shared"), which cannot be in WAL mode and
    # needs no WAL: W001 used to fire in every test run of a project set up as documented.
    (tmp_path / "readme_settings.py").write_text(README_SETTINGS)
    (tmp_path / "readme_tests.py").write_text(README_PROJECT_TEST)
    env = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")
    }
    env["PYTHONPATH"] = str(tmp_path)

    proc = subprocess.run(
        [sys.executable, "-m", "django", "test", "readme_tests", "--settings=readme_settings"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "Ran 1 test" in output
    assert "django_gator." not in output
    assert not (tmp_path / "db.sqlite3").exists()


def test_a_file_backed_test_database_is_still_checked(scratch_sqlite, tmp_path):
    # Only in-memory databases are exempt: a test database in a file is shared by
    # processes like any other.
    scratch_sqlite({}, name=str(tmp_path / "test_db.sqlite3"))
    assert set(database_messages()) == {"django_gator.W001", "django_gator.W002"}


def test_database_checks_run_only_when_a_database_is_named(scratch_sqlite):
    # Like Django's own: `manage.py check` must not connect (an unreachable server would
    # crash it, and SQLite would create its file); `migrate` and `check --database` do.
    wrapper = scratch_sqlite({})

    assert gator_checks.check_database(databases=None) == []
    assert wrapper.connection is None
    # (Django 6 itself skips database checks unless asked; Django 5.2 leaves it to them.)
    assert not [m for m in checks.run_checks() if m.id.startswith("django_gator.W00")]
    named = {m.id for m in checks.run_checks(databases=[SCRATCH])}
    assert {"django_gator.W001", "django_gator.W002"} <= named


@pytest.mark.django_db
def test_the_test_suites_own_database_passes_the_database_checks():
    found = gator_checks.check_database(databases=["default"])
    assert found == []


@pytest.mark.skipif(connection.vendor != "mysql", reason="needs MariaDB or MySQL")
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("mariadb", "version", "message", "fix"),
    [
        (True, (10, 5, 26), "MariaDB 10.5.26 on 'default' has no SKIP LOCKED", "MariaDB 10.6"),
        (True, (10, 4, 0), "MariaDB 10.4.0 on 'default' has no SKIP LOCKED", "MariaDB 10.6"),
        (False, (8, 0, 0), "MySQL 8.0.0 on 'default' has no SKIP LOCKED", "MySQL 8.0.1"),
        (False, (5, 7, 44), "MySQL 5.7.44 on 'default' has no SKIP LOCKED", "MySQL 8.0.1"),
        (True, (10, 6, 0), None, None),
        (False, (8, 0, 1), None, None),
    ],
)
def test_an_old_mariadb_or_mysql_is_an_error_with_the_version_needed(
    mariadb, version, message, fix
):
    # A second real connection to the test server, told it is an older server.
    wrapper = ConnectionHandler({"default": dict(connection.settings_dict)})["default"]
    try:
        wrapper.ensure_connection()
        wrapper.__dict__.update(mysql_is_mariadb=mariadb, mysql_version=version)
        found = engine_checks.check_mysql("default", wrapper)
    finally:
        wrapper.close()

    if message is None:
        assert found == []
        return
    assert [m.id for m in found] == ["django_gator.E004"]
    assert isinstance(found[0], checks.Error)
    assert message in found[0].msg
    assert f"django-gator needs {fix} or newer" in (found[0].hint or "")


@pytest.mark.skipif(connection.vendor != "mysql", reason="needs MariaDB or MySQL")
@pytest.mark.django_db
def test_the_mysql_server_of_the_suite_passes():
    assert gator_checks.check_database(databases=["default"]) == []


# -- schedules declared on job classes ---------------------------------------------------------


@pytest.fixture
def restore_registry() -> Iterator[None]:
    before = set(registered_jobs())
    yield
    for name in set(registered_jobs()) - before:
        unregister(name)


@pytest.mark.parametrize(
    ("schedule", "field", "value"),
    [
        ("61 * * * *", "cron", "61 * * * *"),
        ("* * * *", "cron", "has 4 fields"),
        ("* * 31 2 *", "cron", "'* * 31 2 *' never fires"),
        ("*/61 * * * *", "cron", "in its minute field, '*/61' steps by 61"),
        (Cron("0 3 * * *", timezone="Mars/Olympus"), "timezone", "Mars/Olympus"),
        (Cron("0 3 * * *", queue="no spaces"), "queue", "no spaces"),
        (Cron("0 3 * * *", kwargs={"nope": 1}), "args", "nope"),
        (42, "schedule", "42"),
    ],
    ids=[
        "cron-range",
        "cron-fields",
        "never",
        "step",
        "timezone",
        "queue",
        "arguments",
        "not-a-cron",
    ],
)
@pytest.mark.usefixtures("restore_registry")
def test_a_bad_schedule_on_a_job_class_is_a_check_error_naming_schedule_and_field(
    schedule, field, value
):
    class Nightly(Queueable):
        name = "tests.test_checks.Nightly"

        def handle(self) -> None:
            return None

    Nightly.schedule = schedule

    found = messages_with("django_gator.E005")

    assert len(found) == 1
    assert isinstance(found[0], checks.Error)
    assert f"schedule 'tests.test_checks.Nightly', field '{field}'" in found[0].msg
    assert value in found[0].msg
    unregister(Nightly.name)
    assert not messages_with("django_gator.E005")


@pytest.mark.usefixtures("restore_registry")
def test_every_bad_schedule_is_reported_at_once_with_a_true_hint():
    class Hourly(Queueable):
        name = "tests.test_checks.Hourly"
        schedule = "61 * * * *"

        def handle(self) -> None:
            return None

    broken = {
        "no-job": {"job": "tests.NoSuchJob", "cron": "* * * * *"},
        "fine": {"job": Noop.name, "cron": "*/5 * * * *"},
        "bad-zone": {"job": Noop.name, "cron": "* * * * *", "timezone": "Mars/Olympus"},
    }
    with override_settings(GATOR_SCHEDULES=broken):
        found = messages_with("django_gator.E005")

    assert [m.msg.split(",")[0] for m in found] == [
        "schedule 'tests.test_checks.Hourly'",
        "schedule 'no-job'",
        "schedule 'bad-zone'",
    ]
    assert "field 'cron'" in found[0].msg
    assert "field 'job'" in found[1].msg
    assert "field 'timezone'" in found[2].msg
    # An Error stops runserver, migrate and every command that runs the checks (the worker
    # too); the hint used to say only that workers would not start the scheduler.
    for message in found:
        assert "refuses to run runserver, migrate, gator_worker" in (message.hint or "")


# -- every declared setting ---------------------------------------------------------------------


def setting_messages() -> list[checks.CheckMessage]:
    return [m for m in checks.run_checks() if m.id.startswith("django_gator.")]


def test_the_test_settings_pass_every_settings_check():
    assert [
        m for m in setting_messages() if m.id in ("django_gator.E003", "django_gator.W004")
    ] == []


@pytest.mark.parametrize(("name", "value", "shown"), BAD_CASES)
def test_every_bad_setting_is_one_check_error_naming_it_and_its_value(name, value, shown):
    declared = conf.BY_NAME[name]
    with override_settings(**{name: value}):
        found = [m for m in setting_messages() if name in m.msg]

    assert found, f"{name} = {value!r} passed the checks"
    assert all(isinstance(m, checks.Error) for m in found)
    assert shown in found[0].msg
    if declared.checked_by is None:
        assert [m.id for m in found] == ["django_gator.E003"]
        assert found[0].msg == f"{declared.problem(value)}."
        assert found[0].hint == (
            f"Allowed: {declared.rule.allowed()}; the default is {declared.shown_default()}."
        ).replace("`", "")
    else:
        assert found[0].id == declared.checked_by


def test_bad_settings_are_reported_all_at_once():
    with override_settings(GATOR_CONCURRENCY=0, GATOR_REDACT="token", GATOR_IMMEDIATE="no"):
        found = [m.msg for m in setting_messages() if m.id == "django_gator.E003"]

    assert found == [
        "GATOR_CONCURRENCY must be at least 1, got 0.",
        "GATOR_REDACT must be a list of key names, got 'token'.",
        "GATOR_IMMEDIATE must be True or False, got 'no'.",
    ]


@pytest.mark.parametrize(
    ("name", "path", "words"),
    [
        ("GATOR_MIDDLEWARE", ["tests.testapp.jobs.nope"], "cannot be imported"),
        ("GATOR_MIDDLEWARE", ["tests.testapp.jobs.TRACE"], "is not callable"),
        ("GATOR_SCHEDULER_CLOCK", "tests.clock.no_clock", "cannot be imported"),
    ],
)
def test_a_dotted_path_setting_is_imported_by_the_check(name, path, words):
    with override_settings(**{name: path}):
        found = [m.msg for m in setting_messages() if m.id == "django_gator.E003"]

    assert len(found) == 1
    assert found[0].startswith(f"{name} names 'tests.")
    assert words in found[0]


@pytest.mark.parametrize(("interval", "timeout"), [(5, 5), (5, 4.5)])
def test_a_heartbeat_timeout_not_longer_than_the_interval_is_an_error(interval, timeout):
    with override_settings(GATOR_HEARTBEAT_INTERVAL=interval, GATOR_HEARTBEAT_TIMEOUT=timeout):
        found = [m for m in setting_messages() if m.id == "django_gator.E003"]

    assert [m.msg for m in found] == [
        f"GATOR_HEARTBEAT_TIMEOUT ({timeout}) must be longer than "
        f"GATOR_HEARTBEAT_INTERVAL ({interval})."
    ]
    assert "live workers will be rescued" in (found[0].hint or "")


def test_a_bad_gator_database_is_e002_and_does_not_crash_the_database_checks():
    with override_settings(GATOR_DATABASE=["default"]):
        found = [m for m in checks.run_checks(databases=["default"]) if "GATOR_DATABASE" in m.msg]

    assert [(m.id, m.msg) for m in found] == [
        ("django_gator.E002", "GATOR_DATABASE = ['default'] is not a key of DATABASES.")
    ]


def test_an_undeclared_gator_setting_is_a_warning_with_the_closest_name():
    with override_settings(GATOR_CONCURENCY=8, GATOR_SOMETHING_ELSE=1):
        found = {m.msg: m for m in setting_messages() if m.id == "django_gator.W004"}

    typo = found["GATOR_CONCURENCY is not a django-gator setting; it has no effect."]
    other = found["GATOR_SOMETHING_ELSE is not a django-gator setting; it has no effect."]
    assert len(found) == 2
    assert isinstance(typo, checks.Warning)
    assert typo.hint == "Did you mean GATOR_CONCURRENCY?"
    assert other.hint == "See the settings reference (docs/reference/settings.md)."


# -- at start-up ------------------------------------------------------------------------------

BAD_REDACT_SETTINGS = """
from tests.settings import *  # noqa: F403

GATOR_REDACT = ["password", {"token": 1}]
"""


@pytest.mark.django_db(transaction=True)
def test_gator_worker_refuses_to_start_on_a_bad_setting_before_any_job_runs(tmp_path, spawn_worker):
    # GATOR_REDACT used to be read only when a page or a log line first masked a value.
    (tmp_path / "bad_redact_settings.py").write_text(BAD_REDACT_SETTINGS)
    job = Noop.dispatch()

    proc = spawn_worker(
        "--burst",
        env={
            "DJANGO_SETTINGS_MODULE": "bad_redact_settings",
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        },
    )
    code = proc.wait(timeout=120)

    output = worker_output(proc)
    assert code != 0, output
    assert "SystemCheckError" in output
    assert (
        "(django_gator.E003) GATOR_REDACT must be a list of key names; {'token': 1} is not one."
        in output
    )
    assert Job.objects.get(pk=job.pk).state == JobState.WAITING


def test_a_worker_started_without_the_system_checks_still_refuses_a_bad_setting():
    # call_command() and --skip-checks skip Django's checks; the worker checks anyway.
    from django.core.management import CommandError, call_command

    with (
        override_settings(GATOR_REDACT=["password", {"token": 1}]),
        pytest.raises(CommandError, match=r"GATOR_REDACT.*\{'token': 1\}"),
    ):
        call_command("gator_worker", "--burst")


class KeptThreeDays(Queueable):
    """An idempotency window of three days: within the default retention (7 days)."""

    unique = True
    unique_for = 3 * 86400

    def handle(self, event_id: str) -> None:
        return None


def _w007() -> list[checks.CheckMessage]:
    return [m for m in gator_checks.check_windows() if KeptThreeDays.name in m.msg]


def test_a_unique_for_longer_than_the_pruning_retention_is_a_warning():
    assert _w007() == []
    with override_settings(GATOR_PRUNE_CANCELLED_AFTER=86400):
        [warning] = _w007()
    assert warning.id == "django_gator.W007"
    assert "unique_for is 259200 s, longer than the 86400 s" in warning.msg
    assert "GATOR_PRUNE_CANCELLED_AFTER" in warning.hint
    with override_settings(GATOR_PRUNE_CANCELLED_AFTER=86400, GATOR_AUTO_PRUNE=False):
        assert _w007() == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor == "postgresql", reason="PostgreSQL partitions")
def test_partitioning_on_mariadb_or_sqlite_is_a_warning_and_pruning_stays_delete(settings):
    from django_gator.engines import get_engine
    from django_gator.worker.pruner import Pruner

    settings.GATOR_PARTITIONING = "day"
    [message] = engine_checks.check_partitioning("default", connection)
    assert message.id == "django_gator.W008"
    assert connection.vendor in message.msg
    settings.GATOR_PRUNE_SUCCEEDED_AFTER = 60
    old = Job.objects.create(
        name="x", state=JobState.SUCCEEDED, finished_at=timezone.now() - timedelta(hours=1)
    )
    assert Pruner(get_engine("default"), "pruner-1").prune_once() == 1
    assert not Job.objects.filter(pk=old.pk).exists()
    settings.GATOR_PARTITIONING = None
    assert engine_checks.check_partitioning("default", connection) == []
