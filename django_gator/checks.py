"""System checks with stable ids: django_gator.E001 ...

E001  USE_TZ is False (database times are UTC; local naive times would shift every schedule).
E002  GATOR_DATABASE names no configured database.
E003  A GATOR_* setting has a value of the wrong type or range (or GATOR_MIDDLEWARE
      names something that cannot be imported).
W001  SQLite without WAL journal mode (readers and the worker would block each other).
W002  SQLite without IMMEDIATE transactions ("database is locked" escapes atomic blocks).
W003  The django_gator tables do not exist in GATOR_DATABASE (not migrated). A warning, not
      an error: ``migrate`` runs the database checks before it creates the tables, and an
      error would stop it (and ``migrate`` itself does not show it).
E004  MariaDB older than 10.6 or MySQL older than 8.0.1 (no SKIP LOCKED).
      W001, W002, W003 and E004 look at the database, so like Django's own database checks they
      run only when a database is named: ``migrate``, ``check --database``, the test runner.
E005  A schedule declared on a job class or in GATOR_SCHEDULES is invalid (bad cron
      expression, unknown job, bad time zone, arguments that do not fit...): one error
      per bad schedule.
E006  A TASKS backend that is django_gator.tasks.GatorBackend has bad OPTIONS or QUEUES
      (checked by the Tasks framework's own check).
"""

from __future__ import annotations

import sys
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from django_gator import conf, schema


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    if not settings.USE_TZ:
        errors.append(
            checks.Error(
                f"USE_TZ is {settings.USE_TZ!r}; django-gator needs USE_TZ = True.",
                hint="Job times are stored and compared in UTC; set USE_TZ = True.",
                id="django_gator.E001",
            )
        )
    alias = conf.database()
    if alias not in settings.DATABASES:
        errors.append(
            checks.Error(
                f"GATOR_DATABASE = {alias!r} is not a key of DATABASES.",
                hint=f"Use one of {sorted(settings.DATABASES)}.",
                id="django_gator.E002",
            )
        )
    for name in conf.RANGES:
        problem = conf.range_error(name, conf.get(name))
        if problem is not None:
            errors.append(checks.Error(f"{name} {problem}.", id="django_gator.E003"))
    if conf.heartbeat_timeout() <= conf.heartbeat_interval():
        errors.append(
            checks.Error(
                f"GATOR_HEARTBEAT_TIMEOUT ({conf.heartbeat_timeout()}) must be longer than "
                f"GATOR_HEARTBEAT_INTERVAL ({conf.heartbeat_interval()}).",
                hint="Use a timeout of several intervals, or live workers will be rescued.",
                id="django_gator.E003",
            )
        )
    for validate in (conf.middleware, conf.autodiscover_modules, conf.worker_network_timeout):
        try:
            validate()
        except ImproperlyConfigured as exc:
            errors.append(checks.Error(str(exc), id="django_gator.E003"))
    return errors


@checks.register()
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Schedules declared on job classes and in GATOR_SCHEDULES (admin ones are checked by
    the admin form)."""
    from django_gator.schedules import schedule_errors

    return [
        checks.Error(
            message,
            hint=(
                "Fix or remove this schedule: while a system check error stands, Django "
                "refuses to run runserver, migrate, gator_worker and other management "
                "commands."
            ),
            id="django_gator.E005",
        )
        for message in schedule_errors()
    ]


@checks.register(checks.Tags.database)
def check_database(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    # Like Django's own database checks: only when asked for a database (``migrate``,
    # ``check --database``, the test runner). Plain ``manage.py check`` must not connect
    # (an unreachable server would crash it; SQLite would create its file).
    alias = conf.database()
    if databases is None or alias not in databases or alias not in settings.DATABASES:
        return []
    messages = _check_tables(alias)
    connection = connections[alias]
    if connection.vendor == "sqlite":
        messages += _check_sqlite(alias, connection)
    elif connection.vendor == "mysql":
        messages += _check_mysql(alias, connection)
    return messages


def _check_tables(alias: str) -> list[checks.CheckMessage]:
    if _inside_migrate():
        return []
    missing = schema.missing_tables(alias)
    if not missing:
        return []
    return [
        checks.Warning(
            schema.missing_tables_message(alias, missing) + ".",
            hint="Workers and gator_status cannot run until they exist.",
            id="django_gator.W003",
        )
    ]


def _inside_migrate() -> bool:
    """Whether the checks run for ``manage.py migrate``, which runs the database checks
    before it creates the tables: W003 would then tell a user who is running migrate to run
    migrate. Django gives checks no other way to know the command than the call stack."""
    from django.core.management.commands.migrate import Command as Migrate

    frame = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), Migrate):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _check_sqlite(alias: str, connection: Any) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    # An in-memory database lives in one process, so nothing can block on it, and it cannot
    # be in WAL mode. That includes the test runner's database for a file database without
    # TEST NAME ("file:memorydb_default?mode=memory&cache=shared"), which the check sees in
    # every `manage.py test` run.
    if connection.is_in_memory_db():
        return messages
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        mode = cursor.fetchone()[0]
    if str(mode).lower() != "wal":
        messages.append(
            checks.Warning(
                f"SQLite database {alias!r} is in {mode!r} journal mode, not WAL.",
                hint=(
                    'Add "init_command": "PRAGMA journal_mode=WAL;" to its OPTIONS, so '
                    "workers and web requests do not block each other."
                ),
                id="django_gator.W001",
            )
        )
    transaction_mode = connection.settings_dict.get("OPTIONS", {}).get("transaction_mode")
    if str(transaction_mode or "").upper() != "IMMEDIATE":
        current = "no transaction_mode" if transaction_mode is None else repr(transaction_mode)
        messages.append(
            checks.Warning(
                f"SQLite database {alias!r} does not use IMMEDIATE transactions "
                f"(OPTIONS has {current}).",
                hint=(
                    'Add "transaction_mode": "IMMEDIATE" to its OPTIONS; otherwise an atomic() '
                    'block that dispatches a job can fail with "database is locked" while a '
                    "worker writes."
                ),
                id="django_gator.W002",
            )
        )
    return messages


def _check_mysql(alias: str, connection: Any) -> list[checks.CheckMessage]:
    connection.ensure_connection()
    minimum: tuple[int, ...]
    if connection.mysql_is_mariadb:
        minimum, product = (10, 6), "MariaDB"
    else:
        minimum, product = (8, 0, 1), "MySQL"
    version = connection.mysql_version
    if version < minimum:
        return [
            checks.Error(
                f"{product} {'.'.join(map(str, version))} on {alias!r} has no SKIP LOCKED.",
                hint=f"django-gator needs {product} {'.'.join(map(str, minimum))} or newer.",
                id="django_gator.E004",
            )
        ]
    return []
