"""System checks with stable ids: django_gator.E001 ...

E001  USE_TZ is False (database times are UTC; local naive times would shift every schedule).
E002  GATOR_DATABASE names no configured database.
E003  A GATOR_* setting has a value its declaration in conf.SETTINGS does not allow (wrong
      type, out of range, an empty or non-string entry in a list of names, a dotted path in
      GATOR_MIDDLEWARE or GATOR_SCHEDULER_CLOCK that cannot be imported), or
      GATOR_HEARTBEAT_TIMEOUT is not longer than GATOR_HEARTBEAT_INTERVAL. One error per bad
      setting, naming it and its value; the hint says what it allows. Every declared setting
      is checked (GATOR_DATABASE by E002, GATOR_SCHEDULES by E005).
W001  SQLite without WAL journal mode (readers and the worker would block each other).
W002  SQLite without IMMEDIATE transactions ("database is locked" escapes atomic blocks).
W003  The django_gator tables do not exist in GATOR_DATABASE (not migrated). A warning, not
      an error: ``migrate`` runs the database checks before it creates the tables, and an
      error would stop it (and ``migrate`` itself does not show it).
W004  A setting named GATOR_* that django-gator does not declare (a typo: the setting meant
      keeps its default), with the closest declared name.
W005  An entry of GATOR_QUEUES has an option django-gator does not know (a typo).
E004  MariaDB older than 10.6 or MySQL older than 8.0.1 (no SKIP LOCKED).
      W001, W002, W003 and E004 look at the database, so like Django's own database checks they
      run only when a database is named: ``migrate``, ``check --database``, the test runner.
E005  A schedule declared on a job class or in GATOR_SCHEDULES is invalid (bad cron
      expression, unknown job, bad time zone, arguments that do not fit...): one error
      per bad schedule.
E006  A TASKS backend that is django_gator.tasks.GatorBackend has bad OPTIONS or QUEUES
      (checked by the Tasks framework's own check).
E007  GATOR_READ_DATABASE names no configured database.
W006  GATOR_READ_DATABASE is the job database itself: GATOR_DATABASE's alias, or an alias
      of the same server and database (ENGINE, HOST, PORT, NAME). A warning, not an error:
      every read is still right (it is the primary's), only nothing is taken off the
      primary, and a staging or development setup that points the replica's URL at the
      primary should keep running.
W007  A job class's ``unique_for`` is longer than automatic pruning keeps finished jobs
      (GATOR_PRUNE_SUCCEEDED_AFTER, GATOR_PRUNE_CANCELLED_AFTER): a job pruned before its
      window ends frees its key early.
E008  GATOR_QUEUE_DATABASES is not a dict of queue names to database aliases, names an
      alias that is not a key of DATABASES, or a queue name that is not valid. (W003 and
      E004 look at every job database a database check is run for.)
E012  A job class has ``encrypted = True`` and its data cannot be encrypted: the
      ``cryptography`` package is missing or GATOR_ENCRYPTION_KEYS is empty; or a key of
      GATOR_ENCRYPTION_KEYS is not URL-safe base64 of 32 bytes (whether or not a class uses it).
E013  GATOR_FAIRNESS is not a dict of queue names to options, has an unknown option, or a
      weight that is not a number above 0 (see docs/fairness.md).
W009  A job class defines fairness_key() and its queue is not in GATOR_FAIRNESS: the key is
      not used there (a job dispatched to a fair queue with queue= still is).
W010  The job database has the django_gator tables but not every django_gator migration is
      applied (the package was upgraded and ``migrate`` not run again): names the first
      missing ones and the command. Looks at the database, as W003.
W008  GATOR_PARTITIONING and the jobs table disagree: set on MariaDB, MySQL or SQLite (they
      keep DELETE pruning); set while the PostgreSQL table is plain (the fix: gator_partitions
      --convert); unset while it is partitioned (no worker would create its partitions).
      Looks at the database, as W001.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, connections

from django_gator import conf, encryption, fairness, schema
from django_gator.conf.checking import problems as settings_problems
from django_gator.conf.checking import unknown_names
from django_gator.engines.checks import server_checks
from django_gator.limits import QUEUE_OPTIONS, unknown_queue_options
from django_gator.registry import registered_jobs
from django_gator.validation import validate_queue


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
    alias = conf.get("GATOR_DATABASE")
    if not (isinstance(alias, str) and alias in settings.DATABASES):
        errors.append(
            checks.Error(
                f"GATOR_DATABASE = {alias!r} is not a key of DATABASES.",
                hint=f"Use one of {sorted(settings.DATABASES)}.",
                id="django_gator.E002",
            )
        )
    # Every other declared setting, from the table in conf.py (GATOR_SCHEDULES: E005).
    for problem in settings_problems():
        errors.append(
            checks.Error(f"{problem.message}.", hint=problem.hint, id="django_gator.E003")
        )
    for name, close in unknown_names():
        errors.append(
            checks.Warning(
                f"{name} is not a django-gator setting; it has no effect.",
                hint=f"Did you mean {close}?"
                if close
                else "See the settings reference (docs/reference/settings.md).",
                id="django_gator.W004",
            )
        )
    for queue, options in _queue_table().items():
        try:
            validate_queue(str(queue))
        except ValueError as exc:
            errors.append(
                checks.Error(f"GATOR_QUEUES has a bad key: {exc}.", id="django_gator.E003")
            )
        for option in unknown_queue_options(options):
            errors.append(
                checks.Warning(
                    f"GATOR_QUEUES[{queue!r}] has the option {option!r}, which django-gator "
                    "does not know; it has no effect.",
                    hint=f"Queue options: {', '.join(QUEUE_OPTIONS)}.",
                    id="django_gator.W005",
                )
            )
    return errors


def _queue_table() -> Mapping[str, Any]:
    table = conf.get("GATOR_QUEUES")
    return table if isinstance(table, Mapping) else {}


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
    if databases is None:
        return []
    found = []
    for alias in _job_databases():
        if alias in databases:
            found += _check_tables(alias) + server_checks(alias, connections[alias])
    return found


def _job_databases() -> list[str]:
    """GATOR_DATABASE and the aliases of GATOR_QUEUE_DATABASES that are configured (not
    validated: bad ones are E002 and E008, not a crash)."""
    aliases = [conf.get("GATOR_DATABASE")]
    routed = conf.get("GATOR_QUEUE_DATABASES")
    if isinstance(routed, Mapping):
        aliases += [a for a in routed.values() if a not in aliases]
    return [a for a in aliases if isinstance(a, str) and a in settings.DATABASES]


@checks.register()
def check_queue_databases(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """GATOR_QUEUE_DATABASES: valid queue names routed to configured aliases (E008)."""
    routed = conf.get("GATOR_QUEUE_DATABASES")
    problem = conf.BY_NAME["GATOR_QUEUE_DATABASES"].problem(routed)
    hint = 'Use {"queue": "alias"} with each alias a key of DATABASES.'
    if problem is not None:
        return [checks.Error(f"{problem}.", hint=hint, id="django_gator.E008")]
    errors: list[checks.CheckMessage] = []
    for queue, alias in routed.items():
        try:
            validate_queue(queue)
        except ValueError as exc:
            errors.append(
                checks.Error(f"GATOR_QUEUE_DATABASES has a bad key: {exc}.", id="django_gator.E008")
            )
        if alias not in settings.DATABASES:
            errors.append(
                checks.Error(
                    f"GATOR_QUEUE_DATABASES routes queue {queue!r} to {alias!r}, which is not a "
                    "key of DATABASES.",
                    hint=f"Use one of {sorted(settings.DATABASES)}.",
                    id="django_gator.E008",
                )
            )
    return errors


def _check_tables(alias: str) -> list[checks.CheckMessage]:
    if _inside_migrate():
        return []
    missing = schema.missing_tables(alias)
    if len(missing) < len(schema.tables()):
        # Some tables: an older version migrated them; W010 names the migrations it lacks
        # (a table added since is missing then too). W003 if none lags: one was dropped.
        lagging = _check_migrations(alias)
        if lagging or not missing:
            return lagging
    return [
        checks.Warning(
            schema.missing_tables_message(alias, missing) + ".",
            hint="Workers and gator_status cannot run until they exist.",
            id="django_gator.W003",
        )
    ]


def _check_migrations(alias: str) -> list[checks.CheckMessage]:
    """W010: the tables exist, but migrations of django_gator are not applied (the package
    was upgraded, ``migrate`` not run): commands and workers would meet "no such column"."""
    unapplied = schema.unapplied_migrations(alias)
    if not unapplied:
        return []
    command = "manage.py migrate" + ("" if alias == DEFAULT_DB_ALIAS else f" --database {alias}")
    shown = ", ".join(unapplied[:3]) + (
        f" and {len(unapplied) - 3} more" if len(unapplied) > 3 else ""
    )
    return [
        checks.Warning(
            f"database {alias!r} lacks django_gator migrations: {shown}: run `{command}`.",
            hint="Workers and the gator_* commands need the tables as the installed version "
            "of django-gator has them.",
            id="django_gator.W010",
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


#: The port a database listens on when its alias leaves PORT empty.
DEFAULT_PORTS = {"postgresql": "5432", "mysql": "3306"}
#: HOST values that name this machine (an empty HOST is the local socket or localhost).
LOCAL_HOSTS = {"", "localhost", "127.0.0.1", "::1"}


def _server(config: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """(engine, host, port, database name) of a ``DATABASES`` entry, with the defaults
    spelled out, to compare two aliases."""
    engine = str(config.get("ENGINE", ""))
    vendor = next((v for v in DEFAULT_PORTS if v in engine), engine)
    host = str(config.get("HOST") or "").strip().lower()
    port = str(config.get("PORT") or "").strip() or DEFAULT_PORTS.get(vendor, "")
    return vendor, "localhost" if host in LOCAL_HOSTS else host, port, str(config.get("NAME"))


@checks.register()
def check_read_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """GATOR_READ_DATABASE: a configured alias (E007), not the job database itself (W006)."""
    alias = conf.get("GATOR_READ_DATABASE")
    if alias is None:
        return []
    if not (isinstance(alias, str) and alias in settings.DATABASES):
        return [
            checks.Error(
                f"GATOR_READ_DATABASE = {alias!r} is not a key of DATABASES.",
                hint=f"Use one of {sorted(settings.DATABASES)}, or None to read the primary.",
                id="django_gator.E007",
            )
        ]
    primary = conf.get("GATOR_DATABASE")
    if not (isinstance(primary, str) and primary in settings.DATABASES):
        return []  # E002
    if alias != primary and _server(settings.DATABASES[alias]) != _server(
        settings.DATABASES[primary]
    ):
        return []
    vendor, host, port, name = _server(settings.DATABASES[alias])
    same = (
        "is GATOR_DATABASE itself"
        if alias == primary
        else f"is the same database as GATOR_DATABASE = {primary!r} ({vendor} {name!r} on "
        f"{host}:{port})"
    )
    return [
        checks.Warning(
            f"GATOR_READ_DATABASE = {alias!r} {same}: its reads are the primary's, and take "
            "no load off it.",
            hint="Point it at a replica (a streaming standby) of the job database, or set it "
            "to None.",
            id="django_gator.W006",
        )
    ]


@checks.register()
def check_windows(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A ``unique_for`` longer than the automatic pruning keeps finished jobs: a job pruned
    before its window ends frees its key early."""
    from django_gator.registry import registered_jobs

    try:
        if not conf.auto_prune():
            return []
        kept = min(conf.prune_succeeded_after(), conf.prune_cancelled_after())
    except conf.InvalidSetting:
        return []  # check_settings reports it
    return [
        checks.Warning(
            f"{job_class.name}.unique_for is {window.seconds:g} s, longer than the "
            f"{kept:g} s that automatic pruning keeps finished jobs: a job pruned before its "
            "window ends frees its key early.",
            hint="Raise GATOR_PRUNE_SUCCEEDED_AFTER and GATOR_PRUNE_CANCELLED_AFTER to at "
            "least unique_for, or shorten unique_for.",
            id="django_gator.W007",
        )
        for job_class in registered_jobs().values()
        if (window := job_class.traits.window) is not None
        and window.kind == "unique_for"
        and window.seconds > kept
    ]


@checks.register()
def check_encryption(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E012: encrypted job classes need cryptography and keys; every key must be usable."""
    if conf.BY_NAME["GATOR_ENCRYPTION_KEYS"].problem(conf.get("GATOR_ENCRYPTION_KEYS")):
        return []  # E003 names the setting's bad shape
    encrypted = sorted(n for n, cls in registered_jobs().items() if cls.traits.encrypted)
    if encrypted:
        problem = encryption.unavailable()
        shown = ", ".join(encrypted[:5]) + (" ..." if len(encrypted) > 5 else "")
        message = f"job classes with encrypted = True ({shown}) cannot be encrypted: {problem}"
    else:
        problem = next(
            (
                f"GATOR_ENCRYPTION_KEYS[{index}] {encryption.key_problem(key)}"
                for index, key in enumerate(conf.encryption_keys())
                if encryption.key_problem(key) is not None
            ),
            None,
        )
        message = str(problem)
    if problem is None:
        return []
    return [
        checks.Error(
            message,
            hint="Install django-gator[encryption] and set GATOR_ENCRYPTION_KEYS to a list of "
            "keys, newest first, each from cryptography.fernet.Fernet.generate_key(); "
            "dispatches of encrypted job classes are refused until then.",
            id="django_gator.E012",
        )
    ]


@checks.register()
def check_fairness(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E013: GATOR_FAIRNESS's shape and weights; W009: a fairness key no fair queue uses."""
    table = conf.get("GATOR_FAIRNESS")
    problem = fairness.table_problem(table)
    if problem is not None:
        return [
            checks.Error(
                f"{problem}.",
                hint='Use {"queue": {"weights": {"tenant:big": 3}}}; a key not listed weighs 1.',
                id="django_gator.E013",
            )
        ]
    return [
        checks.Warning(
            f"{name} defines fairness_key(), but its queue {cls.queue!r} is not in "
            "GATOR_FAIRNESS: its jobs there are claimed in the ordinary order.",
            hint=f"Add {cls.queue!r} to GATOR_FAIRNESS (weights are optional).",
            id="django_gator.W009",
        )
        for name, cls in sorted(registered_jobs().items())
        if cls.traits.is_fair and cls.queue not in table
    ]
