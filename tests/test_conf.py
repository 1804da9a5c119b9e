"""django_gator.conf: the declared table of settings, the values derived from it (defaults,
ranges, the settings reference page) and the accessors.

The system checks that validate every setting are tested in tests/test_checks.py, with the
bad values of :data:`BAD` below.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.test import override_settings

from django_gator import conf, databases, replicas
from django_gator.conf import InvalidSetting, access

#: For every declared setting, values its declaration refuses, with the text that the error
#: must show for the value. A setting added to conf.SETTINGS without an entry here fails
#: test_every_declared_setting_has_bad_values.
BAD: dict[str, list[tuple[Any, str]]] = {
    "GATOR_DATABASE": [(5, "5"), ("", "''")],
    "GATOR_QUEUE_DATABASES": [(["bulk"], "['bulk']"), ({"bulk": ""}, "{'bulk': ''}")],
    "GATOR_READ_DATABASE": [(5, "5"), ("", "''")],
    "GATOR_READ_DATABASE_MAX_LAG": [(-1, "-1"), ("30", "'30'"), (math.inf, "inf")],
    "GATOR_DISPATCH_ON_COMMIT": [(1, "1"), ("false", "'false'")],
    "GATOR_DISPATCH_ON_COMMIT_RETRY_DELAYS": [(301, "301"), ([1, -1], "[1, -1]")],
    "GATOR_MAX_PAYLOAD_BYTES": [(1, "1"), (1e6, "1000000.0")],
    "GATOR_MAX_RESULT_BYTES": [(1, "1"), (2.5, "2.5"), ("1000", "'1000'")],
    "GATOR_MAX_BATCH_SIZE": [(0, "0"), (2.5, "2.5")],
    "GATOR_CONCURRENCY": [(0, "0"), ("4", "'4'"), (2.5, "2.5"), (True, "True")],
    "GATOR_PROCESSES": [(0, "0"), ("2", "'2'")],
    "GATOR_ASYNC_CONCURRENCY": [(0, "0"), ("100", "'100'"), (2.5, "2.5")],
    "GATOR_POLL_INTERVAL": [(0, "0"), (math.inf, "inf")],
    "GATOR_HEARTBEAT_INTERVAL": [(0.001, "0.001")],
    "GATOR_HEARTBEAT_TIMEOUT": [(0, "0")],
    "GATOR_MAX_RESCUES": [(0, "0")],
    "GATOR_OUTAGE_RETRIES": [(-1, "-1"), (1.5, "1.5")],
    "GATOR_SHUTDOWN_TIMEOUT": [(-1, "-1")],
    "GATOR_MAX_HANDBACKS": [(0, "0"), (2.5, "2.5"), ("3", "'3'")],
    "GATOR_PROGRESS_INTERVAL": [(-1, "-1"), ("2", "'2'"), (math.inf, "inf")],
    "GATOR_JOB_LOG_LEVEL": [("LOUD", "'LOUD'"), (-1, "-1"), (True, "True")],
    "GATOR_JOB_LOG_LINES": [(0, "0"), ("5", "'5'")],
    "GATOR_JOB_LOG_BYTES": [(10, "10"), (1.5, "1.5")],
    "GATOR_DEFAULT_TIMEOUT": [(0, "0"), (-5, "-5"), (math.inf, "inf")],
    "GATOR_LONG_RUNNING_AFTER": [(0, "0"), (None, "None")],
    "GATOR_UNKNOWN_JOB_WINDOW": [(-1, "-1"), ("soon", "'soon'")],
    "GATOR_AUTODISCOVER": [("tasks", "'tasks'"), (["ok", 3], "3")],
    "GATOR_ASYNC_COMMIT": [("no", "'no'")],
    "GATOR_POOLED_DATABASES": [("default", "'default'"), ([""], "''")],
    "GATOR_LISTEN_DATABASE": [("", "''"), (["direct"], "['direct']")],
    "GATOR_NOTIFY": [("no", "'no'"), (0, "0")],
    "GATOR_WAKEUP_BIND": [("", "''"), ("127.0.0.1", "'127.0.0.1'"), (0, "0"), (":0", "':0'")],
    "GATOR_WORKER_CONN_MAX_AGE": [(-5, "-5"), ("300", "'300'")],
    "GATOR_WARM_CONNECTIONS": [("default", "'default'"), ([""], "''")],
    "GATOR_WORKER_NETWORK_TIMEOUT": [
        (-1, "-1"),
        ("30", "'30'"),
        (True, "True"),
        (1e6, "1000000.0"),
    ],
    "GATOR_MAX_TRACEBACK_CHARS": [(99, "99")],
    "GATOR_REDACT": [("password", "'password'"), (["token", None], "None"), ([""], "''")],
    "GATOR_ENCRYPTION_KEYS": [("key", "'key'"), ([None], "None"), ({"k"}, "{'k'}")],
    "GATOR_MIDDLEWARE": [("a.b", "'a.b'"), ([None], "None")],
    "GATOR_IMMEDIATE": [("yes", "'yes'")],
    "GATOR_QUEUES": [
        ([], "[]"),
        ({"exports": {"concurrency": 0}}, "0"),
        ({"exports": {"concurrency": -3}}, "-3"),
        ({"exports": {"rate_limit": "100 per minute"}}, "'100 per minute'"),
        ({"exports": {"rate_limit": "0/s"}}, "'0/s'"),
        ({"exports": 5}, "5"),
    ],
    "GATOR_FAIRNESS": [([], "[]")],
    "GATOR_SCHEDULES": [([], "[]")],
    "GATOR_SCHEDULER": [(0, "0")],
    "GATOR_SCHEDULER_INTERVAL": [(0, "0")],
    "GATOR_SCHEDULE_MISFIRE_GRACE": [(-1, "-1")],
    "GATOR_SCHEDULE_RUN_RETENTION_DAYS": [(0, "0"), (None, "None")],
    "GATOR_SCHEDULER_CLOCK": [(5, "5")],
    "GATOR_PRUNE_SUCCEEDED_AFTER": [("a week", "'a week'")],
    "GATOR_PRUNE_CANCELLED_AFTER": [(-1, "-1")],
    "GATOR_PRUNE_DEAD_AFTER": [(math.nan, "nan")],
    "GATOR_AUTO_PRUNE": [("off", "'off'")],
    "GATOR_PRUNE_INTERVAL": [(0, "0")],
    "GATOR_PRUNE_BATCH_SIZE": [(0, "0"), (10.5, "10.5")],
    "GATOR_PRUNE_PAUSE": [(-1, "-1"), (61, "61")],
    "GATOR_PARTITIONING": [("week", "'week'"), (True, "True")],
    "GATOR_METRICS_PORT": [(-1, "-1"), (65536, "65536"), ("9108", "'9108'")],
    "GATOR_METRICS_CACHE": [(1, "1"), ("", "''")],
    "GATOR_METRICS_CACHE_SECONDS": [(-1, "-1"), (math.inf, "inf")],
}

BAD_CASES = [
    pytest.param(name, value, shown, id=f"{name}={shown}")
    for name, cases in BAD.items()
    for value, shown in cases
]

#: The accessor of each setting, and what it returns for the default value.
ACCESSORS: dict[str, tuple[Callable[[], Any], Any]] = {
    "GATOR_DATABASE": (conf.database, "default"),
    "GATOR_QUEUE_DATABASES": (databases.routes, {}),
    "GATOR_READ_DATABASE": (replicas.read_database, None),
    "GATOR_READ_DATABASE_MAX_LAG": (replicas.max_lag, 30.0),
    "GATOR_DISPATCH_ON_COMMIT": (conf.dispatch_on_commit, False),
    "GATOR_DISPATCH_ON_COMMIT_RETRY_DELAYS": (conf.dispatch_on_commit_retry_delays, [0.5, 1, 2]),
    "GATOR_MAX_PAYLOAD_BYTES": (conf.max_payload_bytes, 1_048_576),
    "GATOR_MAX_RESULT_BYTES": (conf.max_result_bytes, 1_048_576),
    "GATOR_MAX_BATCH_SIZE": (conf.max_batch_size, 100_000),
    "GATOR_CONCURRENCY": (conf.concurrency, 4),
    "GATOR_PROCESSES": (conf.processes, 1),
    "GATOR_ASYNC_CONCURRENCY": (conf.async_concurrency, 100),
    "GATOR_POLL_INTERVAL": (conf.poll_interval, 1.0),
    "GATOR_HEARTBEAT_INTERVAL": (conf.heartbeat_interval, 5.0),
    "GATOR_HEARTBEAT_TIMEOUT": (conf.heartbeat_timeout, 30.0),
    "GATOR_MAX_RESCUES": (conf.max_rescues, 3),
    "GATOR_OUTAGE_RETRIES": (conf.outage_retries, 10),
    "GATOR_SHUTDOWN_TIMEOUT": (conf.shutdown_timeout, 30.0),
    "GATOR_MAX_HANDBACKS": (conf.max_handbacks, 3),
    "GATOR_PROGRESS_INTERVAL": (conf.progress_interval, 2.0),
    "GATOR_JOB_LOG_LEVEL": (conf.job_log_level, None),
    "GATOR_JOB_LOG_LINES": (conf.job_log_lines, 500),
    "GATOR_JOB_LOG_BYTES": (conf.job_log_bytes, 65_536),
    "GATOR_DEFAULT_TIMEOUT": (conf.default_timeout, None),
    "GATOR_LONG_RUNNING_AFTER": (conf.long_running_after, 3600.0),
    "GATOR_UNKNOWN_JOB_WINDOW": (conf.unknown_job_window, 900.0),
    "GATOR_AUTODISCOVER": (conf.autodiscover_modules, ["jobs", "tasks"]),
    "GATOR_ASYNC_COMMIT": (conf.async_commit, True),
    "GATOR_POOLED_DATABASES": (conf.pooled_databases, frozenset()),
    "GATOR_LISTEN_DATABASE": (conf.listen_database, None),
    "GATOR_NOTIFY": (conf.notify, True),
    "GATOR_WAKEUP_BIND": (conf.wakeup_bind, ("127.0.0.1", 0)),
    "GATOR_WORKER_CONN_MAX_AGE": (conf.worker_conn_max_age, 300.0),
    "GATOR_WARM_CONNECTIONS": (conf.warm_connections, None),
    "GATOR_WORKER_NETWORK_TIMEOUT": (conf.worker_network_timeout, 30.0),
    "GATOR_MAX_TRACEBACK_CHARS": (conf.max_traceback_chars, 20_000),
    "GATOR_REDACT": (conf.redact_keys, frozenset(conf.DEFAULTS["GATOR_REDACT"])),
    "GATOR_ENCRYPTION_KEYS": (conf.encryption_keys, []),
    "GATOR_MIDDLEWARE": (conf.middleware, []),
    "GATOR_IMMEDIATE": (conf.immediate, False),
    "GATOR_QUEUES": (conf.queues, {}),
    "GATOR_FAIRNESS": (conf.fairness, {}),
    "GATOR_SCHEDULES": (conf.schedules, {}),
    "GATOR_SCHEDULER": (conf.scheduler_enabled, True),
    "GATOR_SCHEDULER_INTERVAL": (conf.scheduler_interval, 1.0),
    "GATOR_SCHEDULE_MISFIRE_GRACE": (conf.misfire_grace, 60.0),
    "GATOR_SCHEDULE_RUN_RETENTION_DAYS": (conf.schedule_run_retention_days, 7.0),
    "GATOR_SCHEDULER_CLOCK": (conf.scheduler_clock, None),
    "GATOR_PRUNE_SUCCEEDED_AFTER": (conf.prune_succeeded_after, 604_800.0),
    "GATOR_PRUNE_CANCELLED_AFTER": (conf.prune_cancelled_after, 604_800.0),
    "GATOR_PRUNE_DEAD_AFTER": (conf.prune_dead_after, 2_592_000.0),
    "GATOR_AUTO_PRUNE": (conf.auto_prune, True),
    "GATOR_PRUNE_INTERVAL": (conf.prune_interval, 300.0),
    "GATOR_PRUNE_BATCH_SIZE": (conf.prune_batch_size, 1000),
    "GATOR_PRUNE_PAUSE": (conf.prune_pause, 0.1),
    "GATOR_PARTITIONING": (conf.partitioning, None),
    "GATOR_METRICS_PORT": (conf.metrics_port, None),
    "GATOR_METRICS_CACHE": (conf.metrics_cache, "default"),
    "GATOR_METRICS_CACHE_SECONDS": (conf.metrics_cache_seconds, 15.0),
}


def unset_every_setting(settings: Any) -> None:
    """Remove every GATOR_* setting the test settings set, so each one has its default."""
    for name in conf.BY_NAME:
        if hasattr(settings, name):
            delattr(settings, name)


# -- the declaration ----------------------------------------------------------------------------


def test_every_setting_is_declared_once_with_a_gator_name_and_a_one_line_meaning():
    names = [s.name for s in conf.SETTINGS]
    assert len(names) == len(set(names))
    for setting in conf.SETTINGS:
        assert re.fullmatch(r"GATOR_[A-Z_]+", setting.name)
        assert setting.meaning
        assert "\n" not in setting.meaning
        assert "|" not in setting.meaning
        assert setting.checked_by in (
            None,
            "django_gator.E002",
            "django_gator.E005",
            "django_gator.E007",
            "django_gator.E008",
            "django_gator.E013",
        )


def test_every_declared_setting_has_bad_values_and_an_accessor():
    assert list(BAD) == [s.name for s in conf.SETTINGS]
    assert list(ACCESSORS) == [s.name for s in conf.SETTINGS]


@pytest.mark.parametrize("setting", conf.SETTINGS, ids=lambda s: s.name)
def test_every_default_is_allowed_by_its_own_declaration(setting):
    assert setting.problem(setting.default, deep=True) is None
    assert conf.DEFAULTS[setting.name] == setting.default


def test_the_ranges_of_the_command_line_are_those_of_the_numeric_settings():
    numeric = {s.name for s in conf.SETTINGS if isinstance(s.rule, conf.Number)}
    assert set(conf.RANGES) == numeric
    assert conf.RANGES["GATOR_POLL_INTERVAL"] == (0.001, None)
    assert conf.RANGES["GATOR_CONCURRENCY"] == (1, None)
    assert conf.allowed_range("GATOR_POLL_INTERVAL") == "at least 0.001"
    assert conf.allowed_range("GATOR_WORKER_NETWORK_TIMEOUT") == "from 0 to 999999"
    assert conf.range_error("GATOR_POLL_INTERVAL", 0) == "must be at least 0.001, got 0"
    assert conf.range_error("GATOR_POLL_INTERVAL", 0.0, given="0e0") == (
        "must be at least 0.001, got 0e0"
    )
    assert conf.range_error("GATOR_POLL_INTERVAL", 0.001) is None
    assert conf.range_error("GATOR_CONCURRENCY", "4") == "must be a whole number, got '4'"
    with pytest.raises(LookupError, match="GATOR_REDACT is not a numeric setting"):
        conf.range_error("GATOR_REDACT", [])


# -- the accessors ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ACCESSORS))
def test_an_unset_setting_reads_as_its_default(settings, name):
    unset_every_setting(settings)
    settings.TASKS = {"default": {"BACKEND": conf.TASKS_BACKEND}}
    accessor, expected = ACCESSORS[name]

    assert conf.get(name) == conf.DEFAULTS[name]
    assert conf.value(name) == conf.DEFAULTS[name]
    assert accessor() == expected


@pytest.mark.parametrize(("name", "value", "shown"), BAD_CASES)
def test_an_accessor_refuses_a_bad_value_naming_the_setting_and_the_value(
    settings, name, value, shown
):
    setattr(settings, name, value)
    accessor, _ = ACCESSORS[name]

    with pytest.raises(InvalidSetting) as raised:
        accessor()

    assert str(raised.value).startswith(f"{name} must be ")
    assert shown in str(raised.value)
    # The same words as the system check's (E003), which reports it before anything runs.
    assert str(raised.value) == conf.BY_NAME[name].problem(value)


def test_an_invalid_setting_is_improperly_configured_and_a_value_error():
    # A ValueError too: gator_prune turns one from its retention settings into a message.
    assert issubclass(InvalidSetting, ImproperlyConfigured)
    assert issubclass(InvalidSetting, ValueError)


def test_the_accessors_see_every_change_django_signals(settings):
    settings.GATOR_CONCURRENCY = 7
    assert conf.concurrency() == 7
    settings.GATOR_CONCURRENCY = 2
    assert conf.concurrency() == 2
    with override_settings(GATOR_CONCURRENCY=5, GATOR_QUEUE_DATABASES={"bulk": "default"}):
        assert conf.concurrency() == 5
        assert conf.get("GATOR_QUEUE_DATABASES") == {"bulk": "default"}
    assert conf.concurrency() == 2
    assert conf.get("GATOR_QUEUE_DATABASES") == {}


def test_a_value_read_is_kept_until_a_setting_changes(settings):
    settings.GATOR_CONCURRENCY = 7
    assert conf.concurrency() == 7
    # Kept: the settings object is not read again (a change made behind Django's back,
    # which Django does not support either, is not seen) ...
    holder = django_settings._wrapped
    holder.GATOR_CONCURRENCY = 3
    assert conf.concurrency() == 7
    # ... until a setting_changed signal, of any setting.
    setting_changed.send(sender=None, setting="ANYTHING", value=None, enter=True)
    assert conf.concurrency() == 3


def test_a_bad_value_is_refused_at_every_read(settings):
    settings.GATOR_CONCURRENCY = 0
    for _ in range(2):
        with pytest.raises(InvalidSetting):
            conf.concurrency()
    assert conf.get("GATOR_CONCURRENCY") == 0  # the raw read is kept: the checks report it


def test_a_value_read_across_a_change_is_not_kept(settings):
    """A thread that began reading before a change was signalled, and keeps what it read
    after, must not leave the old value behind."""
    settings.GATOR_CONCURRENCY = 7
    began = access._generation
    access.forget()
    access._keep(access._VALID, "GATOR_CONCURRENCY", 99, began)
    assert conf.concurrency() == 7
    access._keep(access._VALID, "GATOR_CONCURRENCY", 7, access._generation)
    assert access._VALID["GATOR_CONCURRENCY"] == 7


def test_redact_keys_are_lowercased_and_a_set_is_accepted(settings):
    settings.GATOR_REDACT = {"PIN", "Card"}
    assert conf.redact_keys() == frozenset({"pin", "card"})


def test_whole_number_settings_take_ints_and_numbers_take_either(settings):
    settings.GATOR_POLL_INTERVAL = 2
    settings.GATOR_WORKER_CONN_MAX_AGE = None
    settings.GATOR_WORKER_NETWORK_TIMEOUT = 0
    assert conf.poll_interval() == 2.0
    assert isinstance(conf.poll_interval(), float)
    assert conf.worker_conn_max_age() is None
    assert conf.worker_network_timeout() == 0.0


def test_the_scheduler_clock_may_be_a_callable_or_its_path(settings):
    settings.GATOR_SCHEDULER_CLOCK = "tests.clock.file_clock"
    from tests.clock import file_clock

    assert conf.scheduler_clock() is file_clock
    settings.GATOR_SCHEDULER_CLOCK = file_clock
    assert conf.scheduler_clock() is file_clock


# The settings reference page (generated from conf.SETTINGS) is checked in tests/test_docs_site.py.
