"""Read replicas on a real streaming replica (RELIABILITY.md "Several servers"; issue 33):
what only reads reads the replica, bounded by its lag; every write goes to the primary and
the page after it shows the primary's state; a replica that lags or is down is replaced by
the primary, and the page says so; a worker refuses a standby.

A throwaway primary and an asynchronous standby of it (tests/clusters.py), both on their own
ports, never the shared server. Django reaches them as the aliases PRIMARY (GATOR_DATABASE)
and REPLICA (GATOR_READ_DATABASE); the staff users and sessions stay in the suite's
database. The standby's replay is paused (``pg_wal_replay_pause()``) to make it lag.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.db.utils import ConnectionHandler
from django.utils.html import escape

from django_gator import replicas
from django_gator.metrics.queues import queue_figures
from django_gator.models import Job, JobState, Queue
from tests.admin_helpers import operator
from tests.conftest import ROOT, wait_for
from tests.testapp.jobs import Noop

PRIMARY, REPLICA = "gator_primary", "gator_replica"
LIST = "/admin/django_gator/job/"

pytestmark = [
    pytest.mark.clusters,
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="runs in the PostgreSQL pass (on a throwaway cluster of its own)",
    ),
    pytest.mark.django_db(transaction=True, databases=["default", PRIMARY, REPLICA]),
]


def _clusters() -> Any:
    from tests import clusters

    if clusters.server_binaries() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no PostgreSQL server binaries (initdb) on CI")
        pytest.skip("no PostgreSQL server binaries (initdb): cannot make a throwaway cluster")
    return clusters


def _config(url: str, **test: str) -> dict[str, Any]:
    """A complete DATABASES entry (Django's defaults filled in) for ``url``."""
    import environ

    config = environ.Env.db_url_config(url)
    config["TEST"] = dict(test)
    handler = ConnectionHandler({"default": config})
    return dict(handler.settings["default"])


@pytest.fixture(scope="module")
def servers(django_db_setup: None) -> Iterator[tuple[Any, Any]]:
    """A migrated throwaway primary and an asynchronous standby of it, as the aliases
    PRIMARY and REPLICA (added before the tests start, so that they may name them). The
    standby is a mirror of the primary for the test runner: it is never flushed."""
    clusters = _clusters()
    with clusters.throwaway_cluster() as primary:
        env = {
            **os.environ,
            "DATABASE_URL": primary.url("gator"),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "GATOR_TEST_SUBPROCESS": "1",
        }
        env.pop("GATOR_TEST_DB_NAME", None)
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "-v", "0"],
            cwd=ROOT,
            env=env,
            check=True,
            timeout=300,
        )
        with clusters.standby_of(primary, synchronous=False) as standby:
            configs = {
                PRIMARY: _config(primary.url("gator")),
                REPLICA: _config(standby.url("gator"), MIRROR=PRIMARY),
            }
            # connections.settings is DATABASES itself: the patch alone adds the aliases and
            # takes them away (assigning them first made the patch restore them at its end).
            with pytest.MonkeyPatch.context() as patch:
                for alias, config in configs.items():
                    patch.setitem(django_settings.DATABASES, alias, config)
                try:
                    yield primary, standby
                finally:
                    for alias in configs:
                        connections[alias].close()
                        with contextlib.suppress(AttributeError):
                            del connections[alias]
            assert not set(configs) & set(django_settings.DATABASES), "aliases left behind"


@pytest.fixture
def topology(servers: tuple[Any, Any], settings: Any) -> Iterator[tuple[Any, Any]]:
    """GATOR_DATABASE = PRIMARY, GATOR_READ_DATABASE = REPLICA; replay resumed after."""
    primary, standby = servers
    settings.GATOR_DATABASE = PRIMARY
    settings.GATOR_READ_DATABASE = REPLICA
    settings.GATOR_METRICS_CACHE_SECONDS = 0
    replicas.forget_failures()
    try:
        yield primary, standby
    finally:
        if not standby.running:
            standby.start()
        standby.execute("SELECT pg_wal_replay_resume()", database="gator")
        replicas.forget_failures()


def pause_replay(standby: Any) -> None:
    standby.execute("SELECT pg_wal_replay_pause()", database="gator")
    wait_for(lambda: standby.execute("SELECT pg_get_wal_replay_pause_state()") == "paused", 30)


def resume_replay(standby: Any) -> None:
    standby.execute("SELECT pg_wal_replay_resume()", database="gator")


def on_replica(**filters: Any) -> int:
    return Job.objects.using(REPLICA).filter(**filters).count()


def replicated(**filters: Any) -> None:
    """Wait until the replica has the primary's rows matching ``filters``."""
    expected = Job.objects.using(PRIMARY).filter(**filters).count()
    wait_for(lambda: on_replica(**filters) == expected, 30)


def dead(count: int) -> list[Job]:
    return [
        Job.objects.using(PRIMARY).create(
            name="tests.testapp.jobs.Noop", state=JobState.DEAD, last_error="RuntimeError: x"
        )
        for _ in range(count)
    ]


def listed(page: Any) -> list[Job]:
    return list(page.context_data["cl"].result_list)


def read_note(page: Any) -> str:
    source = page.context_data["gator_read_source"]
    assert escape(source.describe()) in page.content.decode()
    return str(source.describe())


# -- what only reads reads the replica, within its lag bound -------------------------------


def test_the_job_list_reads_the_replica_shows_its_lag_and_falls_back_past_the_bound(
    topology, settings
):
    _primary, standby = topology
    client = operator()
    for _ in range(3):
        Noop.dispatch()
    replicated()
    page = client.get(LIST)
    assert len(listed(page)) == 3
    assert read_note(page).startswith(f"Read from the replica {REPLICA!r}, ")
    assert page.context_data["gator_read_source"].lag < 1.0

    pause_replay(standby)
    Noop.dispatch()
    Noop.dispatch()
    assert Job.objects.using(PRIMARY).count() == 5
    page = client.get(LIST)
    assert len(listed(page)) == 3, "the replica's rows, behind the primary's"
    note = read_note(page)
    assert note.startswith(f"Read from the replica {REPLICA!r},")
    assert "behind the primary" in note
    assert page.context_data["gator_read_source"].lag > 0

    # Past the bound: the primary, and the page says why.
    settings.GATOR_READ_DATABASE_MAX_LAG = 1.0
    wait_for(lambda: not replicas.read_source().on_replica, 30)
    page = client.get(LIST)
    assert len(listed(page)) == 5
    note = read_note(page)
    assert note.startswith(f"Read from the primary {PRIMARY!r}: the replica {REPLICA!r} lags ")
    assert "more than GATOR_READ_DATABASE_MAX_LAG (1 s)" in note
    assert b"gator-read-fallback" in page.content

    # Caught up again: the replica, lag 0, though its last replayed commit is older than
    # the bound (an idle primary is not a lagging replica).
    resume_replay(standby)
    replicated()
    time.sleep(1.5)  # deliberate: the last replayed commit is now older than the bound
    wait_for(lambda: replicas.read_source().on_replica, 15)
    page = client.get(LIST)
    assert len(listed(page)) == 5
    assert read_note(page).startswith(f"Read from the replica {REPLICA!r}, ")


def test_the_dashboard_and_a_jobs_page_read_the_replica(topology):
    _primary, standby = topology
    client = operator()
    [job] = dead(1)
    replicated()
    pause_replay(standby)
    Job.objects.using(PRIMARY).filter(pk=job.pk).update(state=JobState.CANCELLED)
    page = client.get(f"{LIST}{job.pk}/change/")
    assert page.context_data["original"].state == JobState.DEAD, "the replica's row"
    assert read_note(page).startswith("Read from the replica")
    dashboard = client.get(f"{LIST}dashboard/")
    [queue] = dashboard.context_data["queues"]
    assert queue.dead == 1, "the replica's count; the primary has none dead"
    assert read_note(dashboard).startswith("Read from the replica")
    dead_screen = client.get(f"{LIST}dead/")
    assert dead_screen.context_data["total"] == 1
    assert read_note(dead_screen).startswith("Read from the replica")


def test_without_a_replica_the_admin_reads_and_writes_gator_database(topology, settings):
    settings.GATOR_READ_DATABASE = None
    client = operator("retry_job")
    [job] = dead(1)
    page = client.get(LIST)
    assert [j.pk for j in listed(page)] == [job.pk], "the primary's row, not the default's"
    assert "gator_read_source" not in page.context_data
    client.post(f"{LIST}{job.pk}/retry/")
    assert Job.objects.using(PRIMARY).get(pk=job.pk).state == JobState.WAITING
    assert not Job.objects.exists()  # the suite's own database


# -- writes go to the primary, and the page after shows them ---------------------------------


def test_an_action_writes_the_primary_and_the_page_after_it_reads_the_primary(topology):
    _primary, standby = topology
    client = operator("retry_job")
    jobs = dead(2)
    replicated()
    pause_replay(standby)

    response = client.post(
        LIST,
        {"action": "retry_jobs", "_selected_action": [jobs[0].pk], "post": "yes"},
        follow=True,
    )
    assert response.status_code == 200
    assert Job.objects.using(PRIMARY).get(pk=jobs[0].pk).state == JobState.WAITING
    assert Job.objects.using(REPLICA).get(pk=jobs[0].pk).state == JobState.DEAD
    states = {job.pk: job.state for job in listed(response)}
    assert states[jobs[0].pk] == JobState.WAITING, "the page after the action: the primary"
    assert "2 job(s) queued" not in response.content.decode()
    assert "1 job(s) queued to run again." in response.content.decode()
    assert read_note(response).endswith("has not yet replayed the latest change made here.")

    # The retry button of a job's page: the page it returns to reads the primary too.
    page = client.post(f"{LIST}{jobs[1].pk}/retry/", follow=True)
    assert page.context_data["original"].state == JobState.WAITING
    assert read_note(page).startswith(f"Read from the primary {PRIMARY!r}")

    # Once the replica has replayed the writes, the pages read it again.
    resume_replay(standby)
    wait_for(lambda: on_replica(state=JobState.WAITING) == 2, 30)
    page = client.get(LIST)
    assert read_note(page).startswith("Read from the replica")
    assert {job.state for job in listed(page)} == {JobState.WAITING}
    assert "gator_written" not in client.session


def test_pausing_a_queue_on_the_dashboard_shows_the_pause_on_the_dashboard_after_it(topology):
    _primary, standby = topology
    client = operator("pause_queue")
    Noop.dispatch()
    replicated()
    pause_replay(standby)
    page = client.post(
        f"{LIST}dashboard/queues/", {"queue": "default", "action": "pause"}, follow=True
    )
    [queue] = page.context_data["queues"]
    assert queue.paused, "the dashboard after the pause reads the primary"
    assert read_note(page).endswith("has not yet replayed the latest change made here.")
    assert not Queue.objects.using(REPLICA).filter(name="default", paused=True).exists()
    assert Queue.objects.using(PRIMARY).get(name="default").paused


def test_a_stopped_replica_is_replaced_by_the_primary_at_once_and_the_page_says_so(topology):
    _primary, standby = topology
    client = operator()
    Noop.dispatch()
    replicated()
    standby.stop("immediate")
    started = time.monotonic()
    page = client.get(LIST)
    first = time.monotonic() - started
    assert len(listed(page)) == 1
    note = read_note(page)
    assert note.startswith(f"Read from the primary {PRIMARY!r}: the replica {REPLICA!r} ")
    assert "does not answer" in note
    assert first < 5, f"the first page after the replica stopped took {first:.1f} s"
    # Known to be down: the next pages do not try it again for a while.
    started = time.monotonic()
    again = client.get(LIST)
    assert "does not answer" in read_note(again)
    assert time.monotonic() - started < first + 1

    standby.start()
    replicas.forget_failures()
    wait_for(lambda: replicas.read_source().on_replica, 30)
    assert read_note(client.get(LIST)).startswith("Read from the replica")


# -- metrics, gator_status, the Tasks backend ------------------------------------------------


def test_the_metrics_gauges_and_gator_status_read_the_replica(topology, settings):
    _primary, standby = topology
    Noop.dispatch()
    replicated()
    pause_replay(standby)
    Noop.dispatch()
    Noop.dispatch()

    [queue] = queue_figures()["queues"]
    assert queue["ready"] == 1, "the replica's figure; the primary has 3 ready"
    scraped = _scrape()
    assert "gator_queue_figures_from_replica 1.0" in scraped
    assert 'gator_queue_ready_jobs{queue="default"} 1.0' in scraped
    assert "gator_read_replica_lag_seconds " in scraped
    out = StringIO()
    call_command("gator_status", stdout=out)
    text = out.getvalue()
    assert text.startswith(f"Read from the replica {REPLICA!r},")
    document = json.loads(_status("--json"))
    assert document["database"] == REPLICA
    assert document["replica"]["read"] is True
    assert [q["ready"] for q in document["queues"]] == [1]
    assert _status("--check", "--min-workers", "0") == "healthy: 0 live workers\n"

    settings.GATOR_READ_DATABASE_MAX_LAG = 1.0
    wait_for(lambda: not replicas.read_source().on_replica, 30)
    [queue] = queue_figures()["queues"]
    assert queue["ready"] == 3
    scraped = _scrape()
    assert "gator_queue_figures_from_replica 0.0" in scraped
    assert 'gator_queue_ready_jobs{queue="default"} 3.0' in scraped
    document = json.loads(_status("--json"))
    assert document["database"] == PRIMARY
    assert document["replica"]["read"] is False
    assert "GATOR_READ_DATABASE_MAX_LAG" in document["replica"]["fallback"]
    assert [q["ready"] for q in document["queues"]] == [3]


def _scrape() -> str:
    from django.test import RequestFactory

    from django_gator.metrics import view

    return str(view(RequestFactory().get("/metrics")).content.decode())


def _status(*args: str) -> str:
    out = StringIO()
    call_command("gator_status", *args, stdout=out)
    return out.getvalue()


# -- a worker refuses the standby ------------------------------------------------------------


def test_a_worker_pointed_at_the_standby_refuses_to_start_and_says_why(topology, settings):
    settings.GATOR_DATABASE = REPLICA
    started = time.monotonic()
    with pytest.raises(CommandError) as refused:
        call_command("gator_worker", "--burst", "--concurrency", "1")
    assert time.monotonic() - started < 30
    assert str(refused.value) == (
        f"The job database {REPLICA!r} does not take writes: it is a standby in recovery "
        "(pg_is_in_recovery() is true). A worker claims and writes jobs: point its job "
        "database at the primary (a replica is for GATOR_READ_DATABASE)."
    )


def test_the_tasks_backend_reads_results_from_the_replica_only_when_asked(topology):
    from django_gator.tasks import GatorBackend, TaskResultStatus
    from tests.testapp import tasks

    _primary, standby = topology
    params = {"QUEUES": ["default"]}
    from_replica = GatorBackend(
        "from_replica", {**params, "OPTIONS": {"results_from_replica": True}}
    )
    from_primary = GatorBackend("from_primary", {**params, "OPTIONS": {}})
    assert from_replica.check() == []
    result = tasks.add_numbers.enqueue(1, 2)
    replicated()
    pause_replay(standby)
    Job.objects.using(PRIMARY).filter(pk=int(result.id)).update(state=JobState.CANCELLED)

    assert from_replica.get_result(result.id).status == TaskResultStatus.READY
    assert from_primary.get_result(result.id).status == TaskResultStatus.FAILED
    # A result the replica does not have yet comes from the primary.
    late = tasks.add_numbers.enqueue(2, 3)
    assert on_replica(pk=int(late.id)) == 0
    assert from_replica.get_result(late.id).id == late.id
