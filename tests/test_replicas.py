"""Read replicas (django_gator/replicas.py, admin/reading.py, engines/replication.py) without
a replica: nothing changes and no statement is added while GATOR_READ_DATABASE is None, the
system checks of a bad read alias, and a worker refusing a server that takes no writes.

The scenarios on a real streaming replica are in tests/reliability/test_replicas.py."""

from __future__ import annotations

import copy
import socket
import time
from collections.abc import Iterator
from io import StringIO

import pytest
from django.conf import settings as django_settings
from django.core import checks
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_gator import replicas
from django_gator.engines import replication
from django_gator.metrics.queues import queue_figures
from django_gator.models import Job, JobState
from tests.admin_helpers import dead_job, operator

#: What the replication statements contain; none may run without a replica.
REPLICATION_WORDS = ("pg_last", "wal_lsn", "pg_is_in_recovery", "REPLICA STATUS", "read_only")


def _replication_statements(captured: CaptureQueriesContext) -> list[str]:
    return [
        q["sql"] for q in captured.captured_queries if any(w in q["sql"] for w in REPLICATION_WORDS)
    ]


@pytest.mark.django_db
def test_without_a_replica_choosing_where_to_read_runs_no_statement(django_assert_num_queries):
    with django_assert_num_queries(0):
        source = replicas.read_source()
        assert replicas.written() is None
    assert source.alias == "default"
    assert source.replica is None
    assert not source.on_replica


@pytest.mark.django_db
def test_without_a_replica_no_page_command_or_scrape_adds_a_statement_or_says_anything():
    client = operator("retry_job")
    job = dead_job()
    with CaptureQueriesContext(connection) as captured:
        pages = [
            client.get("/admin/django_gator/job/"),
            client.get(f"/admin/django_gator/job/{job.pk}/change/"),
            client.get("/admin/django_gator/job/dashboard/"),
            client.get("/admin/django_gator/job/dead/"),
        ]
        retried = client.post(
            "/admin/django_gator/job/",
            {"action": "retry_jobs", "_selected_action": [job.pk], "post": "yes"},
        )
        after = client.get("/admin/django_gator/job/")
        call_command("gator_status", stdout=StringIO())
        call_command("gator_status", "--check", "--min-workers", "0", stdout=StringIO())
        with override_settings(GATOR_METRICS_CACHE_SECONDS=0):
            queue_figures()
    assert [p.status_code for p in pages] == [200, 200, 200, 200]
    assert retried.status_code == 302
    assert Job.objects.get(pk=job.pk).state == JobState.WAITING
    for page in [*pages, after]:
        assert b"gator-read-source" not in page.content
    assert _replication_statements(captured) == []
    assert "gator_written" not in client.session


# -- system checks ---------------------------------------------------------------------------


def _read_messages() -> list[checks.CheckMessage]:
    # The read alias's own check only: the whole registry's model checks ask each alias's
    # server about JSON (Django 6.1), which the "copy" alias may not be opened for here.
    from django_gator.checks import check_read_database

    return [m for m in check_read_database() if m.id in ("django_gator.E007", "django_gator.W006")]


@pytest.fixture
def second_alias(monkeypatch) -> str:
    """ "copy": another alias of the suite's own database (same ENGINE, HOST, PORT, NAME)."""
    monkeypatch.setitem(
        django_settings.DATABASES, "copy", copy.deepcopy(django_settings.DATABASES["default"])
    )
    return "copy"


def test_an_unknown_read_alias_is_an_error_naming_it(settings):
    settings.GATOR_READ_DATABASE = "replica"
    [message] = _read_messages()
    assert message.id == "django_gator.E007"
    assert message.msg == "GATOR_READ_DATABASE = 'replica' is not a key of DATABASES."
    assert "default" in (message.hint or "")
    settings.GATOR_READ_DATABASE = 7
    [message] = _read_messages()
    assert message.msg == "GATOR_READ_DATABASE = 7 is not a key of DATABASES."


def test_a_read_alias_of_the_job_database_itself_is_a_warning_naming_both(settings, second_alias):
    settings.GATOR_READ_DATABASE = "default"
    [message] = _read_messages()
    assert message.id == "django_gator.W006"
    assert "GATOR_READ_DATABASE = 'default' is GATOR_DATABASE itself" in message.msg

    settings.GATOR_READ_DATABASE = second_alias
    [message] = _read_messages()
    assert message.id == "django_gator.W006"
    assert "GATOR_READ_DATABASE = 'copy' is the same database as GATOR_DATABASE = 'default'" in (
        message.msg
    )
    assert isinstance(message, checks.Warning)


def test_a_read_alias_of_another_database_passes(settings, second_alias):
    django_settings.DATABASES[second_alias]["NAME"] = "another"
    settings.GATOR_READ_DATABASE = second_alias
    assert _read_messages() == []
    settings.GATOR_READ_DATABASE = None
    assert _read_messages() == []


def test_the_servers_are_compared_with_their_defaults_spelled_out():
    from django_gator.checks import _server

    pg = "django.db.backends.postgresql"
    assert _server({"ENGINE": pg, "HOST": "", "PORT": "", "NAME": "x"}) == _server(
        {"ENGINE": pg, "HOST": "127.0.0.1", "PORT": "5432", "NAME": "x"}
    )
    assert _server({"ENGINE": pg, "HOST": "db1", "NAME": "x"}) != _server(
        {"ENGINE": pg, "HOST": "db2", "NAME": "x"}
    )
    assert _server({"ENGINE": pg, "PORT": 5433, "NAME": "x"}) != _server(
        {"ENGINE": pg, "NAME": "x"}
    )


# -- a worker on a server that takes no writes ----------------------------------------------

#: How each server makes a session read-only from the start (a real read-only session).
READ_ONLY_OPTIONS = {
    "postgresql": {"options": "-c default_transaction_read_only=on"},
    "mysql": {"init_command": "SET SESSION TRANSACTION READ ONLY"},
}
server_only = pytest.mark.skipif(
    connection.vendor not in READ_ONLY_OPTIONS, reason="SQLite has no read-only server"
)


@pytest.fixture
def read_only_alias(django_db_setup, monkeypatch) -> Iterator[str]:
    """ "readonly": the suite's test database, through sessions that are read-only."""
    config = copy.deepcopy(connections["default"].settings_dict)
    options = config.setdefault("OPTIONS", {})
    added = READ_ONLY_OPTIONS[connection.vendor]
    for key, value in added.items():
        options[key] = (
            f"{options[key]}; {value}" if key == "init_command" and key in options else value
        )
    # connections.settings is DATABASES itself: one setitem, undone at teardown.
    monkeypatch.setitem(django_settings.DATABASES, "readonly", config)
    try:
        yield "readonly"
    finally:
        connections["readonly"].close()
        del connections["readonly"]


@server_only
def test_a_worker_refuses_a_read_only_server_and_says_why(
    read_only_alias, settings, django_db_blocker
):
    # Not a django_db test: a TestCase refuses an alias added after it started.
    with django_db_blocker.unblock():
        assert replication.read_only_reason("default") is None
        reason = replication.read_only_reason(read_only_alias)
        assert reason is not None
        assert "read-only" in reason
        settings.GATOR_DATABASE = read_only_alias
        with pytest.raises(CommandError) as refused:
            call_command("gator_worker", "--burst", "--concurrency", "1")
    message = str(refused.value)
    assert f"The job database {read_only_alias!r} does not take writes" in message
    assert "read-only" in message


# -- a replica that never answers --------------------------------------------------------------


@pytest.fixture
def silent_replica(django_db_setup, monkeypatch, settings) -> Iterator[str]:
    """ "silent": an alias of the suite's server type whose address accepts TCP connections
    and then says nothing (a hung host, a half-open proxy), made GATOR_READ_DATABASE."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # never accepted: the handshake completes, no reply follows
        config = copy.deepcopy(connections["default"].settings_dict)
        config.update(HOST="127.0.0.1", PORT=str(listener.getsockname()[1]))
        config["OPTIONS"] = {
            k: v for k, v in (config.get("OPTIONS") or {}).items() if k != "connect_timeout"
        }
        # connections.settings is DATABASES itself: one setitem, undone at teardown.
        monkeypatch.setitem(django_settings.DATABASES, "silent", config)
        settings.GATOR_READ_DATABASE = "silent"
        replicas.forget_failures()
        try:
            yield "silent"
        finally:
            replicas.forget_failures()
            connections["silent"].close()
            del connections["silent"]


@server_only
def test_a_replica_that_never_answers_costs_one_short_wait_then_none(
    silent_replica, django_db_blocker
):
    with django_db_blocker.unblock():
        started = time.monotonic()
        first = replicas.read_source()
        waited = time.monotonic() - started
        started = time.monotonic()
        second = replicas.read_source()
        again = time.monotonic() - started
    assert first.alias == "default"
    assert first.fallback.startswith("does not answer (")
    assert 1.5 < waited < 6, f"the connect timeout (2 s) was not applied: {waited:.1f} s"
    assert second.fallback == first.fallback
    assert again < 0.5, "a replica known to be down is not tried again at once"
    assert "Read from the primary 'default': the replica 'silent' does not answer" in (
        first.describe()
    )


@pytest.mark.django_db
def test_the_health_check_judges_a_replicas_rows_as_of_its_lag(settings):
    from datetime import timedelta

    from django.utils import timezone

    from django_gator import health
    from django_gator.models import Worker

    settings.GATOR_HEARTBEAT_TIMEOUT = 10.0
    settings.GATOR_HEARTBEAT_INTERVAL = 1.0
    beat = timezone.now() - timedelta(seconds=7)  # stale past half the timeout (5 s)
    Worker.objects.create(id="w1", hostname="h", pid=1, concurrency=1, heartbeat_at=beat)
    stale = health.check(min_workers=1)
    assert [p for p in stale.problems if "stale" in p], stale.problems
    # Read on a replica 4 s behind, the heartbeat is 3 s old: as fresh as it was then.
    assert health.check(min_workers=1, lag=4.0).problems == []


@pytest.mark.django_db
def test_a_server_that_is_no_replica_lags_nothing_and_shows_every_write():
    measured = replication.lag("default", "default")
    assert measured == replication.Lag(0.0)
    assert not measured.standby
    position = replication.write_position("default")
    if connection.vendor == "postgresql":
        assert isinstance(position, int)
        assert position > 0
    else:
        assert position is None
    assert replicas.shows(measured, replicas.Written(position, time.time()))
