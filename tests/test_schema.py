"""An unmigrated database: the django_gator tables are named as missing, with the fix, by
django_gator.schema, the database system check (W003) and gator_status, on every database
the suite runs on. The unmigrated database is a real, empty one made for the test: a SQLite
file, or a database created next to the test database on PostgreSQL and MariaDB."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.conf import settings
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections
from django.db.utils import ConnectionHandler
from django.test import override_settings

from django_gator import checks as gator_checks
from django_gator import schema
from tests.management.commandline import manage

EMPTY = "gator_unmigrated"
ALL_TABLES = [
    "django_gator_batch",
    "django_gator_fair_share",
    "django_gator_finished_tally",
    "django_gator_flow_start",
    "django_gator_job",
    "django_gator_lease",
    "django_gator_queue",
    "django_gator_schedule",
    "django_gator_scheduledrun",
    "django_gator_worker",
    "django_gator_workflow",
    "django_gator_workflow_step",
]


def _url(config: dict[str, Any]) -> str:
    if config["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{config['NAME']}"
    scheme = "postgres" if config["ENGINE"].endswith("postgresql") else "mysql"
    auth = quote(config["USER"] or "")
    if config.get("PASSWORD"):
        auth += ":" + quote(config["PASSWORD"])
    port = f":{config['PORT']}" if config.get("PORT") else ""
    return f"{scheme}://{auth}@{config['HOST'] or 'localhost'}{port}/{config['NAME']}"


@pytest.fixture
def unmigrated(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    django_db_setup: None,
    django_db_blocker: Any,
) -> Iterator[str]:
    """An empty database of the suite's vendor under the alias EMPTY, made GATOR_DATABASE;
    yields its DATABASE_URL. (Not a django_db test: a TestCase would refuse the alias.)"""
    config = dict(connection.settings_dict)
    config["OPTIONS"] = dict(config.get("OPTIONS") or {})
    config["TEST"] = {}
    server_db = None
    with django_db_blocker.unblock():
        if connection.vendor == "sqlite":
            config["NAME"] = str(tmp_path / "unmigrated.sqlite3")
        else:
            # Next to this run's test database, so parallel runs (TEST_DB_SUFFIX) differ.
            server_db = f"{connection.settings_dict['NAME']}_unmigrated"
            admin = ConnectionHandler({"default": dict(config)})["default"]
            quoted = admin.ops.quote_name(server_db)
            with admin.cursor() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS {quoted}")
                charset = " CHARACTER SET utf8mb4" if connection.vendor == "mysql" else ""
                cursor.execute(f"CREATE DATABASE {quoted}{charset}")
            config["NAME"] = server_db
        wrapper = ConnectionHandler({"default": config, EMPTY: config})[EMPTY]
        monkeypatch.setitem(settings.DATABASES, EMPTY, wrapper.settings_dict)
        connections[EMPTY] = wrapper
        try:
            with override_settings(GATOR_DATABASE=EMPTY):
                yield _url(config)
        finally:
            wrapper.close()
            del connections[EMPTY]
            if server_db is not None:
                with admin.cursor() as cursor:
                    force = " WITH (FORCE)" if connection.vendor == "postgresql" else ""
                    cursor.execute(f"DROP DATABASE IF EXISTS {quoted}{force}")
                admin.close()


def test_missing_tables_names_every_table_of_an_unmigrated_database(unmigrated):
    assert schema.missing_tables(EMPTY) == ALL_TABLES


@pytest.mark.django_db
def test_the_suites_migrated_database_misses_no_table():
    assert schema.tables() == set(ALL_TABLES)
    assert schema.missing_tables("default") == []


def test_the_database_check_says_the_tables_do_not_exist_and_to_migrate(unmigrated):
    found = [m for m in gator_checks.check_database(databases=[EMPTY])]
    warnings = [m for m in found if m.id == "django_gator.W003"]

    assert len(warnings) == 1
    assert isinstance(warnings[0], checks.Warning)
    assert warnings[0].msg == (
        "the django_gator tables do not exist: run "
        f"`manage.py migrate --database {EMPTY}` (database {EMPTY!r})."
    )
    # Not when no database is named (plain `manage.py check` does not connect).
    assert not [m for m in checks.run_checks() if m.id == "django_gator.W003"]


def test_migrate_is_not_stopped_by_the_check_and_silences_it(unmigrated):
    # migrate runs the database checks before it creates the tables: W003 must not stop it.
    call_command("migrate", "django_gator", database=EMPTY, verbosity=0)

    assert schema.missing_tables(EMPTY) == []
    assert not [
        m for m in gator_checks.check_database(databases=[EMPTY]) if m.id == "django_gator.W003"
    ]


def test_manage_py_migrate_does_not_tell_to_run_migrate(unmigrated):
    # `migrate` runs the database checks before it migrates (call_command() skips them):
    # the first migrate of a new project must neither stop at W003 nor show it.
    proc = manage("migrate", "django_gator", DATABASE_URL=unmigrated)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Applying django_gator.0001_initial... OK" in proc.stdout
    assert "W003" not in proc.stdout + proc.stderr
    assert schema.missing_tables(EMPTY) == []


def test_a_partly_migrated_database_names_the_missing_tables(unmigrated):
    call_command("migrate", "django_gator", "0003", database=EMPTY, verbosity=0)

    missing = schema.missing_tables(EMPTY)

    assert missing == [
        "django_gator_batch",
        "django_gator_fair_share",
        "django_gator_finished_tally",
        "django_gator_flow_start",
        "django_gator_lease",
        "django_gator_queue",
        "django_gator_schedule",
        "django_gator_scheduledrun",
        "django_gator_workflow",
        "django_gator_workflow_step",
    ]
    assert schema.missing_tables_message(EMPTY, missing).endswith(
        f"(database {EMPTY!r}; missing: django_gator_batch, django_gator_fair_share, "
        "django_gator_finished_tally, django_gator_flow_start, django_gator_lease, "
        "django_gator_queue, django_gator_schedule, django_gator_scheduledrun, "
        "django_gator_workflow, django_gator_workflow_step)"
    )


def test_gator_status_names_the_missing_tables_instead_of_a_database_error(unmigrated):
    with pytest.raises(CommandError) as info:
        call_command("gator_status", stdout=StringIO())

    assert str(info.value) == (
        "the django_gator tables do not exist: run "
        f"`manage.py migrate --database {EMPTY}` (database {EMPTY!r})"
    )


@pytest.mark.parametrize(
    ("args", "returncode", "stream"),
    [
        (["gator_status"], 1, "stderr"),
        (["gator_status", "--json"], 1, "stderr"),
        # Each of the others says it in one line too, instead of a 60-line traceback.
        (["gator_retry", "--all"], 1, "stderr"),
        (["gator_prune"], 1, "stderr"),
        (["gator_workflow", "retry", "6f1c4b1e-2b4e-4c55-9f51-3c1de2e6c0aa"], 1, "stderr"),
        (["gator_rotate_keys", "--job", "billing.jobs.Statement"], 1, "stderr"),
        (["gator_queue", "list"], 1, "stderr"),
        (["check", "--database", "default"], 0, "stderr"),
    ],
)
def test_from_the_command_line_on_an_unmigrated_database(unmigrated, args, returncode, stream):
    proc = manage(*args, DATABASE_URL=unmigrated)

    output = getattr(proc, stream)
    assert proc.returncode == returncode, proc.stdout + proc.stderr
    if returncode:
        assert proc.stderr.count("\n") == 1, proc.stderr
    assert "the django_gator tables do not exist: run `manage.py migrate`" in output
    for raw in ("no such table", "does not exist\nLINE", "doesn't exist", "Traceback"):
        assert raw not in proc.stdout + proc.stderr


def test_a_database_whose_migrations_lag_the_code_is_named_by_w010(unmigrated):
    """The tables exist (an older version migrated them) but the newest migrations are not
    applied: W010 names them and the command, where W003 has nothing to say."""
    call_command("migrate", "django_gator", "0024", database=EMPTY, verbosity=0)

    found = [
        m for m in gator_checks.check_database(databases=[EMPTY]) if m.id.endswith(("W003", "W010"))
    ]

    assert [m.id for m in found] == ["django_gator.W010"]
    # A table added since (0027's fair share counters) is missing too: still W010 alone.
    assert found[0].msg.startswith(
        f"database {EMPTY!r} lacks django_gator migrations: 0025_encryption, 0026_awaited, "
        "0027_fairness"
    )
    assert found[0].msg.endswith(f": run `manage.py migrate --database {EMPTY}`.")
    call_command("migrate", "django_gator", database=EMPTY, verbosity=0)
    assert schema.unapplied_migrations(EMPTY) == []
    assert not [m for m in gator_checks.check_database(databases=[EMPTY]) if m.id.endswith("W010")]
