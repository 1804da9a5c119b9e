"""The indexes the contract names, in the plans of the statements the engines send: the
claim reads the ready index in order; the writes that target known jobs find their rows by
primary key, so their cost does not grow with the number of jobs the worker (or the table)
has seen.

The table is first given the history that made the old plans slow: thousands of jobs that
one worker ran to success, with no vacuum since, so the partial index of running jobs and
the (state, finished_at) index hold an entry for each of them under that worker."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_gator.attempts import Claim, Failure, Mark
from django_gator.engines import get_engine
from django_gator.engines.base import LostClaim
from django_gator.models import Worker
from tests.engines.conformance import covers, statements
from tests.testapp.jobs import Echo, Noop

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "plans-worker"
HISTORY = 3000


def _history() -> list[tuple[int, int]]:
    """HISTORY jobs run to success by WORKER in batches (as a worker does), plus 16
    running now; returns the running claims (id, attempts)."""
    engine = get_engine("default")
    Worker.objects.create(id=WORKER, hostname="h", pid=1, concurrency=16)
    Noop.dispatch_many([[] for _ in range(HISTORY + 16)])
    for _ in range(HISTORY // 100):
        claimed, _ = engine.claim_and_mark(WORKER, "default", 100, [])
        engine.mark_succeeded(WORKER, [Mark(j.id, j.attempts, None) for j in claimed])
    running, _ = engine.claim_and_mark(WORKER, "default", 16, [])
    assert len(running) == 16
    return [(j.id, j.attempts) for j in running]


def explain(sql: str) -> str:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("EXPLAIN " + sql)
            return "\n".join(row[0] for row in cursor.fetchall())
        if connection.vendor == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + sql)
            return "\n".join(row[3] for row in cursor.fetchall())
        cursor.execute("EXPLAIN " + sql)
        columns = [c[0] for c in cursor.description]
        return "\n".join(str(dict(zip(columns, row, strict=True))) for row in cursor.fetchall())


def _assert_by_primary_key(sql: str) -> None:
    plan = explain(sql)
    job_lines = [line for line in plan.splitlines() if "django_gator_job" in line]
    if connection.vendor == "postgresql":
        assert "django_gator_job_pkey" in plan, plan
        assert "gator_job_running" not in plan, plan
        assert "gator_job_state_finished" not in plan, plan
        assert "Seq Scan on django_gator_job" not in plan, plan
    elif connection.vendor == "sqlite":
        assert job_lines, plan
        assert all("USING INTEGER PRIMARY KEY" in line for line in job_lines), plan
    else:
        assert job_lines, plan
        assert all("'key': 'PRIMARY'" in line for line in job_lines), plan


def _writes(action) -> list[str]:
    """The UPDATE statements ``action`` sends to the jobs table (rolled back after)."""
    with CaptureQueriesContext(connection) as captured:
        action()
    return [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].lstrip().upper().startswith("UPDATE") and "django_gator_job" in q["sql"]
    ]


def _failure() -> Failure:
    return Failure(dead=False, retry_in=5.0, queue="default", error="{}", last_error="E: x")


@pytest.mark.parametrize(
    "write",
    ["mark_succeeded_batch", "mark_succeeded_one", "mark_failed", "release", "rescue"],
)
@covers("mark_succeeded", "mark_failed_and_insert", "release", "rescue")
def test_writes_to_known_jobs_find_them_by_primary_key(write):
    engine = get_engine("default")
    running = _history()
    (first_id, first_attempts) = running[0]
    cutoff = engine.db_now() + timedelta(seconds=1)  # every worker counts as lapsed
    actions = {
        "mark_succeeded_batch": lambda: engine.mark_succeeded(
            WORKER, [Mark(i, a, None) for i, a in running]
        ),
        "mark_succeeded_one": lambda: engine.mark_succeeded(
            WORKER, [Mark(first_id, first_attempts, '"r"')]
        ),
        "mark_failed": lambda: engine.mark_failed_and_insert(
            WORKER, Claim(first_id, first_attempts), _failure(), []
        ),
        "release": lambda: engine.release(WORKER, [Claim(first_id, first_attempts)]),
        "rescue": lambda: engine.rescue(
            LostClaim(first_id, first_attempts, WORKER, 0, False, 0),
            cutoff,
            dead=False,
            error="{}",
            last_error="lost",
        ),
    }
    # Explain the statement as sent while the rows are still running, then send it.
    statements = _writes(actions[write])
    assert statements
    for sql in statements:
        _assert_by_primary_key(sql)


@covers("lost_claims")
def test_rescue_finds_the_jobs_of_lapsed_workers_by_owner():
    """The routine rescue pass reads the lapsed workers' entries only: with every worker
    alive it reads no job at all."""
    engine = get_engine("default")
    _history()

    with CaptureQueriesContext(connection) as captured:
        lost = engine.lost_claims(engine.db_now() - timedelta(seconds=30))

    assert lost == []
    assert len(captured.captured_queries) == 2  # db_now() and the worker table
    assert "django_gator_job" not in captured.captured_queries[-1]["sql"]


def _claims(action) -> list[str]:
    """The statements ``action`` sends that read the queue table."""
    with CaptureQueriesContext(connection) as captured:
        action()
    return [q["sql"] for q in captured.captured_queries if "django_gator_queue" in q["sql"]]


@pytest.mark.parametrize("kind", ["full", "keyset"])
@covers("claim_and_mark")
def test_a_claim_checks_its_queue_once_per_statement_by_primary_key(kind):
    """The pause check of a claim is one probe of the queue row, made once for the whole
    statement (not once per job row), and the jobs are still read through the ready index."""
    from django_gator import pause_queue
    from django_gator.engines.core import Position

    engine = get_engine("default")
    if kind == "keyset" and not engine.supports_keyset:
        pytest.skip("keyset claims are PostgreSQL's")
    pause_queue("other")  # the table has a row, of another queue
    if connection.vendor == "postgresql":
        # A table with a history, and its statistics as they are (autovacuum would keep
        # them so): the statistics an earlier test left on this table (TRUNCATE keeps
        # them) may make a scan of the whole table look cheapest for 50 rows.
        _history()
    jobs = Noop.dispatch_many([[] for _ in range(50)])
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE django_gator_job")
    after = None
    if kind == "keyset":
        after = Position({0: (jobs[0].next_execution_at - timedelta(seconds=5), 0)}, 1.0)
    sent = _claims(lambda: engine.claim_and_mark(WORKER, "default", 10, [], after=after))
    assert sent
    for sql in sent:
        plan = explain(sql)
        if connection.vendor == "postgresql":
            assert "gator_job_ready" in plan, plan
            # An InitPlan under a One-Time Filter: evaluated once, before any job is read.
            assert "One-Time Filter" in plan, plan
            assert "SubPlan" not in plan, plan
        elif connection.vendor == "sqlite":
            assert "gator_job_ready" in plan, plan
            queue_lines = [line for line in plan.splitlines() if "django_gator_queue" in line]
            assert queue_lines, plan
            assert all("PRIMARY KEY" in line or "autoindex" in line for line in queue_lines), plan
            assert "CORRELATED" not in plan, plan
        else:
            # The subquery runs once (not DEPENDENT); the optimizer reads the queue row by
            # its primary key as a constant ("const table"), or names the key.
            subquery = [line for line in plan.splitlines() if "'SUBQUERY'" in line]
            assert subquery, plan
            assert all("const table" in line or "'PRIMARY'" in line for line in subquery), plan
            assert any("gator_job_ready_my" in line for line in plan.splitlines()), plan
            assert "DEPENDENT" not in plan, plan


def _sent(kind: str, running: list[tuple[int, int]]) -> tuple[str, list[object]]:
    """The statement (and its parameters) of a full claim, a keyset claim or a batched
    success mark of the ``running`` claims, as the engine sends it."""
    from django_gator.engines.core import Position

    engine = get_engine("default")
    jobs = Noop.dispatch_many([[] for _ in range(50)])
    after = Position({0: (jobs[0].next_execution_at, jobs[0].id)}, 1.0)
    actions = {
        "full": lambda: engine.claim_and_mark(WORKER, "default", 10, []),
        "keyset": lambda: engine.claim_and_mark(WORKER, "default", 10, [], after=after),
        "mark": lambda: engine.mark_succeeded(WORKER, [Mark(i, a, None) for i, a in running]),
    }
    sent: list[tuple[str, list[object]]] = []

    def record(execute, sql, params, many, context):
        sent.append((sql, list(params)))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        actions[kind]()
    [(sql, params)] = [(s, p) for s, p in sent if "django_gator_job" in s]
    return sql, params


def _generic_plan(sql: str, params: list[object]) -> str:
    """PostgreSQL's generic plan of ``sql`` (one plan for any parameters), in this session."""
    numbers = iter(range(1, len(params) + 1))
    prepared = re.sub("%s", lambda _: f"${next(numbers)}", sql)
    with connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE gator_generic AS {prepared}")
        placeholders = ", ".join(["%s"] * len(params))
        cursor.execute(f"EXPLAIN EXECUTE gator_generic({placeholders})", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("DEALLOCATE gator_generic")
        cursor.execute("RESET plan_cache_mode")
    return plan


def _assert_indexed(kind: str, plan: str) -> None:
    assert "Seq Scan on django_gator_job" not in plan, plan
    assert "django_gator_job_pkey" in plan, plan  # the UPDATE finds its rows by primary key
    lines = plan.splitlines()
    for n, line in enumerate(lines):  # ... each by its id, not the whole key read through
        if "using django_gator_job_pkey" in line:
            assert "Index Cond" in lines[n + 1], plan
    if kind == "mark":
        assert "gator_job_running" not in plan, plan
        # Each row looked up by its id, not the whole primary key read into a join.
        assert re.search(r"Index Cond: \((\w+\.)?id = ANY", plan), plan
    else:
        assert "gator_job_ready" in plan, plan
        assert "One-Time Filter" in plan, plan


@pytest.mark.skipif("connection.vendor != 'postgresql'")
@pytest.mark.parametrize("kind", ["full", "keyset", "mark"])
@covers("claim_and_mark", "mark_succeeded")
def test_the_generic_plans_of_the_prepared_statements_use_the_indexes(kind):
    """The claims and the batched success mark run as prepared statements, and PostgreSQL
    may plan a prepared statement once for any parameters (a generic plan) instead of for
    the values at hand. That plan, too, reads the ready index (the claims) or finds the
    rows by primary key (the mark), on a table with the history of _history()."""
    running = _history()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_gator_job")  # statistics of the table as it is
    _assert_indexed(kind, _generic_plan(*_sent(kind, running)))


@pytest.mark.skipif("connection.vendor != 'postgresql'")
@pytest.mark.parametrize("kind", ["full", "keyset", "mark"])
@covers("prepare_bookkeeping", "claim_and_mark", "mark_succeeded")
def test_a_bookkeeping_sessions_generic_plans_use_the_indexes_however_small_the_table(
    kind, settings
):
    """A worker's bookkeeping session keeps the plan PostgreSQL made at its first claim,
    with the table as it was then: at a first start, empty and never analyzed, when a scan
    of the whole table is the cheapest plan (and stays, however large the table grows).
    prepare_bookkeeping() turns sequential scans off in that session: the indexes still."""
    settings.GATOR_POOLED_DATABASES = []
    Worker.objects.create(id=WORKER, hostname="h", pid=1, concurrency=16)
    Noop.dispatch_many([[] for _ in range(16)])
    running, _ = get_engine("default").claim_and_mark(WORKER, "default", 16, [])
    statement = _sent(kind, [(j.id, j.attempts) for j in running])
    connection.close()
    try:
        get_engine("default").prepare_bookkeeping()
        _assert_indexed(kind, _generic_plan(*statement))
    finally:
        connection.close()  # the next test gets a session of its own


@covers("claim_and_mark")
def test_the_claim_reads_the_ready_index_in_its_order():
    """The statement the claim sends (its SELECT part on MariaDB, which locks the rows it
    picks) reads the ready index in the claim's order: no sort."""
    engine = get_engine("default")
    Echo.dispatch_many([[i] for i in range(50)])
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE django_gator_job")
    [sql] = _claims(lambda: engine.claim_and_mark(WORKER, "echo", 10, []))
    if connection.vendor == "mysql":
        plan = explain(sql)
        job_lines = [line for line in plan.splitlines() if "'django_gator_job'" in line]
        assert all("'key': 'gator_job_ready_my'" in line for line in job_lines), plan
        assert "filesort" not in plan, plan
    elif connection.vendor == "sqlite":
        plan = explain(sql)
        assert "gator_job_ready" in plan, plan
        assert "TEMP B-TREE" not in plan, plan
    else:
        with connection.cursor() as cursor:
            cursor.execute("SET enable_seqscan = off")  # 50 rows: the index, if it can
            try:
                plan = explain(sql)
            finally:
                cursor.execute("RESET enable_seqscan")
        assert "gator_job_ready" in plan, plan
        assert "Sort" not in plan, plan


@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite's plan for this statement follows its statistics: seen on the ready "
    "index in one run and on gator_job_state_finished with a temporary B-tree for the "
    "ORDER BY in another, with the same SQLite (3.40.1) and rows",
)
@covers("ready_queues")
def test_the_queue_search_is_a_skip_scan_of_the_ready_index():
    engine = get_engine("default")
    for queue in ("a", "b", "c"):
        Noop.dispatch_many([[] for _ in range(20)], queue=queue)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE django_gator_job")
    with statements() as sent:
        assert engine.ready_queues() == ["a", "b", "c"]
    [sql] = sent
    plan = explain(sql)
    index = "gator_job_ready_my" if connection.vendor == "mysql" else "gator_job_ready"
    assert index in plan, plan
    if connection.vendor == "postgresql":
        assert "Seq Scan on django_gator_job" not in plan, plan
