"""Several job databases (GATOR_QUEUE_DATABASES; issue 33 items 2 and 4): dispatch writes
each job to its queue's database, within the caller's transaction there or at the commit of
one on another database; a batch or workflow that spans two databases is refused; workers
serve one database each or, under one gator_worker, every one; the command-line surfaces,
the metrics and the admin show each database; a routed database without the tables, or
unknown, gets a clear error.

The second job database is BULK: a second PostgreSQL database on the suite's server (in
the PostgreSQL pass), or a SQLite file (every pass), migrated by the module's fixture and
removed after it. The suite's own database stays ``default`` (GATOR_DATABASE).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.db import connection, connections, transaction
from django.db.utils import ConnectionHandler
from django.test.utils import CaptureQueriesContext

from django_gator import databases, pause_queue
from django_gator.checks import check_queue_databases
from django_gator.engines import get_engine
from django_gator.exceptions import CrossDatabase, SchemaMissing
from django_gator.models import Batch, Job, JobState, Schedule, WorkflowRun
from django_gator.queueable import Queueable
from django_gator.routers import JobDatabaseRouter
from django_gator.workflows import Workflow
from tests.admin_helpers import operator
from tests.conftest import run_worker, worker_output
from tests.testapp.jobs import Noop

BULK = "gator_jobs_bulk"
EMPTY = "gator_jobs_empty"  # configured, never migrated
ROUTES = {"bulk": BULK}

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", BULK, EMPTY])


class BulkFirst(Queueable):
    queue = "bulk"

    def handle(self, n: int) -> int:
        return n + 1


class BulkSecond(Queueable):
    queue = "bulk"

    def handle(self, n: int) -> dict[str, Any]:
        return {"n": n, "before": self.results()}


class BulkAtomic(Queueable):
    """Tells whether its handler ran inside a transaction on its own database."""

    queue = "bulk"
    atomic = True

    def handle(self) -> bool:
        return connections[BULK].in_atomic_block and not connections["default"].in_atomic_block


def _sqlite(path: str) -> dict[str, Any]:
    import environ

    config = environ.Env.db_url_config(f"sqlite:///{path}")
    config["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    config["TEST"] = {"NAME": path}
    return _complete(config)


def _complete(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with Django's defaults filled in (TEST's too)."""
    handler = ConnectionHandler({"default": config})
    return dict(handler.settings["default"])


def _postgres_twin() -> dict[str, Any]:
    """A second database on the suite's PostgreSQL server, created empty."""
    config = {**connections["default"].settings_dict}
    name = f"{config['NAME']}_bulk"[:63]
    with connections["default"].cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')
        cursor.execute(f'CREATE DATABASE "{name}"')
    config.update(NAME=name, TEST={"NAME": name}, OPTIONS=dict(config.get("OPTIONS") or {}))
    return _complete(config)


def _drop_postgres_twin(config: dict[str, Any]) -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{config["NAME"]}"')


def _reset_caches() -> None:
    get_engine.cache_clear()  # engines are cached by alias; BULK changes vendor
    databases.forget_checks()


@pytest.fixture(scope="module", params=["postgresql", "sqlite"])
def bulk(
    request: pytest.FixtureRequest, django_db_setup: None, django_db_blocker: Any
) -> Iterator[dict[str, Any]]:
    """BULK (migrated) and EMPTY (not), added to the connections for the module's tests;
    the DATABASES entry of BULK."""
    if request.param == "postgresql" and connection.vendor != "postgresql":
        pytest.skip("a second PostgreSQL database: the PostgreSQL pass")
    folder = tempfile.mkdtemp(prefix="gator-multidb-")
    with django_db_blocker.unblock():
        config = (
            _postgres_twin()
            if request.param == "postgresql"
            else _sqlite(os.path.join(folder, "bulk.sqlite3"))
        )
        configs = {BULK: config, EMPTY: _sqlite(os.path.join(folder, "empty.sqlite3"))}
        # connections.settings is DATABASES itself: the patch alone adds the aliases, and
        # takes them away at the end (assigning them first made the patch restore them, and
        # the aliases outlived the module: Django 6.1's checks then opened them in every
        # later test).
        with pytest.MonkeyPatch.context() as patch:
            for alias, entry in configs.items():
                patch.setitem(django_settings.DATABASES, alias, entry)
            _reset_caches()
            try:
                call_command("migrate", database=BULK, verbosity=0)
                yield config
            finally:
                for alias in configs:
                    connections[alias].close()
                    with contextlib.suppress(AttributeError):
                        del connections[alias]
        assert not set(configs) & set(django_settings.DATABASES), "aliases left behind"
        _reset_caches()
        if request.param == "postgresql":
            _drop_postgres_twin(config)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def routed(bulk: dict[str, Any], settings: Any) -> dict[str, Any]:
    settings.GATOR_QUEUE_DATABASES = ROUTES
    return bulk


def _states(alias: str) -> list[tuple[str, str]]:
    return list(Job.objects.using(alias).order_by("id").values_list("queue", "state"))


# -- dispatch -------------------------------------------------------------------------------


def test_dispatch_writes_each_job_to_its_queues_database(routed: Any) -> None:
    bulk_job = Noop.dispatch(queue="bulk")
    plain = Noop.dispatch()
    many = Noop.dispatch_many([[1], [2], [3]], queue="bulk")
    assert bulk_job._state.db == BULK
    assert plain._state.db == "default"
    assert _states(BULK) == [("bulk", JobState.WAITING)] * 4
    assert _states("default") == [("default", JobState.WAITING)]
    assert {job._state.db for job in many} == {BULK}
    ids = Job.objects.using(BULK).filter(pk__in=[j.pk for j in many]).order_by("id")
    assert [job.pk for job in many] == list(ids.values_list("pk", flat=True))


def test_a_transaction_on_another_database_holds_the_insert_until_it_commits(
    routed: Any,
) -> None:
    with transaction.atomic(using="default"):
        job = Noop.dispatch(queue="bulk")
        assert _states(BULK) == []  # waits for the commit of default's transaction
    assert _states(BULK) == [("bulk", JobState.WAITING)]
    assert Job.objects.using(BULK).get(pk=job.pk).queue == "bulk"

    with contextlib.suppress(RuntimeError), transaction.atomic(using="default"):
        Noop.dispatch(queue="bulk")
        raise RuntimeError("roll back")
    assert len(_states(BULK)) == 1  # rolled back: nothing inserted


def test_a_transaction_on_the_same_database_takes_the_insert_in(routed: Any) -> None:
    with contextlib.suppress(RuntimeError), transaction.atomic(using=BULK):
        Noop.dispatch(queue="bulk")
        assert len(_states(BULK)) == 1  # inside the open transaction
        raise RuntimeError("roll back")
    assert _states(BULK) == []


def test_a_workflow_across_two_databases_is_refused_and_nothing_is_inserted(
    routed: Any,
) -> None:
    workflow = Workflow("mixed")
    first = workflow.add(BulkFirst, 1)
    workflow.add(Noop, after=[first])
    with pytest.raises(CrossDatabase) as refused:
        workflow.dispatch()
    message = str(refused.value)
    assert "'default'" in message
    assert repr(BULK) in message
    assert "'bulk'" in message
    for alias in ("default", BULK):
        assert not WorkflowRun.objects.using(alias).exists()
        assert not Job.objects.using(alias).exists()


def test_a_batch_across_two_databases_is_refused_before_the_second_insert(
    routed: Any,
) -> None:
    with Batch(description="mixed"):
        Noop.dispatch()
        with pytest.raises(CrossDatabase) as refused:
            Noop.dispatch(queue="bulk")
    assert repr(BULK) in str(refused.value)
    assert "'default'" in str(refused.value)
    assert _states(BULK) == []


def test_a_chain_on_a_routed_queue_runs_within_its_database(routed: Any) -> None:
    from django_gator.chain import Chain

    Chain(BulkFirst, BulkSecond).dispatch(1)
    assert WorkflowRun.objects.using(BULK).count() == 1
    assert not WorkflowRun.objects.using("default").exists()
    run_worker(alias=BULK)
    results = dict(Job.objects.using(BULK).values_list("name", "result"))
    assert results[BulkSecond.name] == {"n": 1, "before": {"0": 2}}


# -- job rows -------------------------------------------------------------------------------


def test_a_routed_jobs_own_operations_use_its_database(routed: Any) -> None:
    job = Noop.dispatch(queue="bulk")
    Job.objects.using(BULK).filter(pk=job.pk).update(state=JobState.DEAD)
    job = Job.objects.using(BULK).get(pk=job.pk)
    assert job.retry() is True
    assert Job.objects.using(BULK).get(pk=job.pk).state == JobState.WAITING
    assert job.cancel() is True
    assert Job.objects.using(BULK).get(pk=job.pk).state == JobState.CANCELLED
    with pytest.raises(CrossDatabase, match="cannot move to another database"):
        Job.objects.using("default").filter(pk=1).retry(queue="bulk")


def test_pausing_a_routed_queue_writes_its_database(routed: Any) -> None:
    pause_queue("bulk")
    from django_gator.models import Queue

    assert Queue.objects.using(BULK).get(name="bulk").paused
    assert not Queue.objects.using("default").filter(name="bulk").exists()


# -- workers --------------------------------------------------------------------------------


def test_two_workers_each_serve_their_own_database(routed: Any) -> None:
    Noop.dispatch(queue="bulk")
    atomic = BulkAtomic.dispatch()
    Noop.dispatch()
    run_worker(alias=BULK)
    assert _states(BULK) == [("bulk", JobState.SUCCEEDED)] * 2
    assert _states("default") == [("default", JobState.WAITING)]
    assert Job.objects.using(BULK).get(pk=atomic.pk).result is True
    run_worker()
    assert _states("default") == [("default", JobState.SUCCEEDED)]


def test_one_gator_worker_serves_every_job_database(routed: Any, spawn_worker: Any) -> None:
    Noop.dispatch_many([[i] for i in range(3)], queue="bulk")
    Noop.dispatch_many([[i] for i in range(2)])
    proc = spawn_worker(
        "--burst",
        "-v",
        "1",
        env={
            "GATOR_TEST_JOB_DATABASES": json.dumps({BULK: routed}),
            "GATOR_TEST_QUEUE_DATABASES": json.dumps(ROUTES),
            "GATOR_LOG_LEVEL": "INFO",
        },
    )
    assert proc.wait(timeout=180) == 0, worker_output(proc)
    assert _states(BULK) == [("bulk", JobState.SUCCEEDED)] * 3
    assert _states("default") == [("default", JobState.SUCCEEDED)] * 2
    output = worker_output(proc)
    assert f"database={BULK}" in output
    assert "database=default" in output


def test_each_databases_scheduler_holds_the_schedules_of_its_queues(
    routed: Any, settings: Any
) -> None:
    from django_gator.worker.scheduler import Scheduler

    settings.GATOR_SCHEDULES = {
        "bulk-nightly": {"job": BulkFirst.name, "cron": "0 3 * * *", "args": [1]},
        "plain-nightly": {"job": Noop.name, "cron": "0 3 * * *"},
    }
    Scheduler(BULK).sync_declared()
    Scheduler("default").sync_declared()
    assert list(Schedule.objects.using(BULK).values_list("name", flat=True)) == ["bulk-nightly"]
    assert "bulk-nightly" not in set(
        Schedule.objects.using("default").filter(enabled=True).values_list("name", flat=True)
    )
    assert Schedule.objects.using("default").filter(name="plain-nightly").exists()


# -- bad topology ---------------------------------------------------------------------------


def test_a_routed_database_without_the_tables_is_named_with_the_command_to_run(
    bulk: Any, settings: Any
) -> None:
    settings.GATOR_QUEUE_DATABASES = {"bulk": EMPTY}
    with pytest.raises(SchemaMissing, match=f"manage.py migrate --database {EMPTY}"):
        Noop.dispatch(queue="bulk")
    with pytest.raises(CommandError, match=f"manage.py migrate --database {EMPTY}"):
        call_command("gator_worker", "--database", EMPTY, "--burst")


def test_an_unknown_alias_is_a_system_check_error_and_a_worker_error(
    bulk: Any, settings: Any
) -> None:
    settings.GATOR_QUEUE_DATABASES = {"bulk": "nowhere"}
    [error] = check_queue_databases()
    assert error.id == "django_gator.E008"
    assert "'nowhere'" in error.msg
    settings.GATOR_QUEUE_DATABASES = ROUTES
    with pytest.raises(CommandError, match="'elsewhere' is not a job database"):
        call_command("gator_worker", "--database", "elsewhere", "--burst")
    assert check_queue_databases() == []


def test_the_router_keeps_gator_tables_in_the_job_databases(routed: Any) -> None:
    router = JobDatabaseRouter()
    assert router.allow_migrate(BULK, "django_gator") is True
    assert router.allow_migrate("default", "django_gator") is True
    assert router.allow_migrate(EMPTY, "django_gator") is False
    assert router.allow_migrate(BULK, "auth") is None
    job = Noop.dispatch(queue="bulk")
    assert router.db_for_write(Job, instance=job) == BULK
    assert router.db_for_read(Job) == "default"
    assert router.db_for_read(connection.__class__) is None


# -- what shows the databases ---------------------------------------------------------------


def test_gator_status_and_gator_queue_show_every_database_labelled(routed: Any) -> None:
    Noop.dispatch(queue="bulk")
    Noop.dispatch()
    out = StringIO()
    call_command("gator_status", "--json", stdout=out)
    document = json.loads(out.getvalue())
    assert document["database"] == "default"
    by_alias = {d["database"]: d for d in document["databases"]}
    assert [q["queue"] for q in by_alias[BULK]["queues"]] == ["bulk"]
    assert [q["queue"] for q in by_alias["default"]["queues"]] == ["default"]
    out = StringIO()
    call_command("gator_status", stdout=out)
    assert f"Database {BULK!r}" in out.getvalue()
    out = StringIO()
    call_command("gator_queue", "list", "--json", stdout=out)
    listed = {(q["database"], q["queue"]) for q in json.loads(out.getvalue())}
    assert listed == {("default", "default"), (BULK, "bulk")}
    out = StringIO()
    call_command("gator_status", "--check", "--min-workers", "0", stdout=out)
    assert out.getvalue().startswith("healthy")
    with pytest.raises(CommandError) as unhealthy:
        call_command("gator_status", "--check")
    assert f"database {BULK!r}: " in str(unhealthy.value)


def test_the_queue_gauges_carry_a_database_label(routed: Any, settings: Any) -> None:
    pytest.importorskip("prometheus_client")
    from django_gator.metrics.queues import QueueCollector

    settings.GATOR_METRICS_CACHE_SECONDS = 0
    Noop.dispatch(queue="bulk")
    Noop.dispatch()
    ready = next(f for f in QueueCollector().collect() if f.name == "gator_queue_ready_jobs")
    assert {(s.labels["database"], s.labels["queue"], s.value) for s in ready.samples} == {
        ("default", "default", 1.0),
        (BULK, "bulk", 1.0),
    }


def test_the_admin_lists_each_database_under_its_selector(routed: Any) -> None:
    bulk_job = Noop.dispatch(queue="bulk")
    plain = Noop.dispatch()
    Job.objects.using(BULK).filter(pk=bulk_job.pk).update(state=JobState.DEAD)
    client = operator("retry_job")
    page = client.get("/admin/django_gator/job/").content.decode()
    assert "gator-databases" in page
    assert f"?database={BULK}" in page
    assert f"/admin/django_gator/job/{plain.pk}/change/" in page
    page = client.get(f"/admin/django_gator/job/?database={BULK}").content.decode()
    assert f'<strong class="gator-database-selected">{BULK}</strong>' in page
    assert 'class="field-queue">bulk<' in page
    change = client.get(
        f"/admin/django_gator/job/{bulk_job.pk}/change/?_changelist_filters=database%3D{BULK}"
    )
    assert change.status_code == 200
    assert f"retry/?database={BULK}" in change.content.decode()
    client.post(f"/admin/django_gator/job/{bulk_job.pk}/retry/?database={BULK}")
    assert Job.objects.using(BULK).get(pk=bulk_job.pk).state == JobState.WAITING
    dashboard = client.get(f"/admin/django_gator/job/dashboard/?database={BULK}")
    assert dashboard.status_code == 200
    assert "bulk" in dashboard.content.decode()
    Job.objects.using(BULK).filter(pk=bulk_job.pk).update(state=JobState.DEAD)
    dead = client.get(f"/admin/django_gator/job/dead/?database={BULK}").content.decode()
    assert f'<input type="hidden" name="database" value="{BULK}">' in dead
    assert f"database={BULK}" in dead.split("gator-filters", 1)[1]  # the group's job list


# -- nothing changes without the setting ----------------------------------------------------


@pytest.mark.parametrize("configured", [False, True])
def test_a_dispatch_on_gator_database_costs_the_same_statements(
    bulk: Any, settings: Any, configured: bool
) -> None:
    """One INSERT for a plain dispatch, whether or not queues are routed elsewhere (the
    unset setting reads nothing more; a queue that is not routed pays nothing)."""
    if configured:
        settings.GATOR_QUEUE_DATABASES = ROUTES
    Noop.dispatch()  # the first connects
    with (
        CaptureQueriesContext(connection) as default,
        CaptureQueriesContext(connections[BULK]) as other,
    ):
        Noop.dispatch()
        Noop.dispatch_many([[1], [2]])
    assert len(default.captured_queries) == 2, default.captured_queries
    assert other.captured_queries == []


def test_a_task_on_a_routed_queue_has_a_result_id_naming_its_database(
    bulk: Any, settings: Any
) -> None:
    from tests.testapp import tasks

    settings.GATOR_QUEUE_DATABASES = {"tasks": BULK}
    result = tasks.render_report.enqueue(7)
    pk = Job.objects.using(BULK).get().pk
    assert result.id == f"{BULK}:{pk}"
    run_worker(alias=BULK)
    done = tasks.render_report.get_result(result.id)
    assert done.return_value == {"report": 7, "format": "pdf"}
    plain = tasks.add_numbers.enqueue(1, 2)
    assert plain.id == str(Job.objects.using("default").get().pk)


def test_run_jobs_runs_the_jobs_of_every_job_database(routed: Any) -> None:
    from django_gator.testing import assert_dispatched, run_jobs

    Noop.dispatch(1, queue="bulk")
    Noop.dispatch(2)
    assert_dispatched(Noop, 1)
    ran = run_jobs()
    assert sorted((job._state.db, job.args) for job in ran) == [("default", [2]), (BULK, [1])]
    assert _states(BULK) == [("bulk", JobState.SUCCEEDED)]


def test_a_worker_refuses_a_routed_database_that_takes_no_writes(
    routed: dict[str, Any],
) -> None:
    if connections[BULK].vendor != "postgresql":
        pytest.skip("a read-only PostgreSQL database (default_transaction_read_only)")
    name = routed["NAME"]
    with connections["default"].cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    connections[BULK].close()  # new sessions are read-only
    try:
        with pytest.raises(CommandError, match=rf"{BULK}.* does not take writes"):
            call_command("gator_worker", "--database", BULK, "--burst")
    finally:
        with connections["default"].cursor() as cursor:
            cursor.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
        connections[BULK].close()


def test_gator_retry_prune_and_workflow_take_the_job_database(routed: Any) -> None:
    job = Noop.dispatch(queue="bulk")
    Job.objects.using(BULK).filter(pk=job.pk).update(state=JobState.DEAD)
    call_command("gator_retry", "--all", "--database", BULK, stdout=StringIO())
    assert Job.objects.using(BULK).get(pk=job.pk).state == JobState.WAITING
    out = StringIO()
    call_command("gator_prune", "--dry-run", "--database", BULK, stdout=out)
    assert out.getvalue()
    with pytest.raises(CommandError, match="'nowhere' is not a job database"):
        call_command("gator_prune", "--dry-run", "--database", "nowhere")
    run = Workflow("bulk only")
    run.add(BulkFirst, 1)
    dispatched = run.dispatch()
    call_command("gator_workflow", "cancel", str(dispatched.id), "--database", BULK)
    states = Job.objects.using(BULK).filter(name=BulkFirst.name).values_list("state", flat=True)
    assert list(states) == [JobState.CANCELLED]


def test_a_routed_database_is_listened_to_on_its_own_connection(routed: Any, settings: Any) -> None:
    from django_gator.worker.pooling import listen_engine

    if connection.vendor != "postgresql":
        pytest.skip("LISTEN is PostgreSQL's")
    settings.GATOR_LISTEN_DATABASE = "default"  # a direct connection to GATOR_DATABASE
    settings.GATOR_NOTIFY = True  # the default (the suite may run with it off)
    bulk_engine = get_engine(BULK)
    expected = bulk_engine if bulk_engine.can_listen else None  # SQLite polls
    assert listen_engine(bulk_engine, 1.0) is expected
    assert listen_engine(get_engine("default"), 1.0) is get_engine("default")


def test_a_batch_or_workflow_whose_callback_lives_elsewhere_is_refused(routed: Any) -> None:
    with Batch(description="callback elsewhere", on_success=Noop):
        with pytest.raises(CrossDatabase, match="on_success"):
            BulkFirst.dispatch(1)
        Noop.dispatch()  # members and callback on GATOR_DATABASE: accepted
    workflow = Workflow("handler elsewhere", on_error=Noop)
    workflow.add(BulkFirst, 1)
    with pytest.raises(CrossDatabase, match="'default' holds queue 'default'"):
        workflow.dispatch()
    assert _states(BULK) == []
