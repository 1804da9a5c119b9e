"""dispatch() and dispatch_many(): the row they write, the transaction they write it in, and
the bad input they refuse before anything reaches the database."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from datetime import timezone as dt_timezone
from decimal import Decimal
from typing import Any

import pytest
from django.db import IntegrityError, OperationalError, connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_gator import Queueable, job
from django_gator.engines import get_engine
from django_gator.exceptions import PayloadTooLarge
from django_gator.models import Job, JobState
from tests.conftest import PARTITIONED_SUITE
from tests.factories import FACTORY_WORKER, JobFactory
from tests.testapp.jobs import add, record_kw

pytestmark = pytest.mark.django_db

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="needs PostgreSQL (second connection, NOTIFY)"
)


class DispatchAnything(Queueable):
    """Takes any arguments; non-default queue and priority to tell defaults from overrides."""

    queue = "probe"
    priority = 7

    def handle(self, *args: Any, **kwargs: Any) -> None:
        return None


class DispatchStrict(Queueable):
    def handle(self, user_id: int, *, flag: bool = False) -> None:
        return None


@job(name="tests.test_dispatch.renamed_function", queue="fn-queue", priority=-3)
def dispatch_renamed_function(x: int, y: int = 0) -> int:
    return x * 10 + y


class Rollback(Exception):
    """Raised to roll a transaction.atomic() block back."""


@contextmanager
def rolled_back() -> Iterator[None]:
    """An atomic block that always rolls back (after its body ran to the end)."""
    with contextlib.suppress(Rollback), transaction.atomic():
        yield
        raise Rollback


def seen_from_another_connection(pk: int | None) -> bool:
    """Whether a fresh connection (a new thread has its own) sees the job row ``pk``."""
    seen: list[bool] = []

    def look() -> None:
        try:
            seen.append(Job.objects.filter(pk=pk).exists())
        finally:
            connections.close_all()  # this thread's connections only

    thread = threading.Thread(target=look)
    thread.start()
    thread.join(timeout=30)
    assert seen, "the reader thread did not finish"
    return seen[0]


# -- the row dispatch writes ----------------------------------------------------------------


def test_dispatch_returns_the_saved_row_with_every_column_as_in_the_database():
    before = timezone.now()
    job = DispatchAnything.dispatch(1, "two", [3.5, None], four={"x": True})
    after = timezone.now()

    assert isinstance(job, Job)
    assert job.pk is not None
    assert job._state.adding is False
    row = Job.objects.get(pk=job.pk)
    assert row.name == "tests.test_dispatch.DispatchAnything"
    assert row.args == [1, "two", [3.5, None]]
    assert row.kwargs == {"four": {"x": True}}
    assert row.queue == "probe"
    assert row.priority == 7
    assert row.state == JobState.WAITING
    assert row.attempts == 0
    assert row.rescues == 0
    assert row.reserved_by is None
    assert row.locked_at is None
    assert row.started_at is None
    assert row.finished_at is None
    assert row.errors is None
    assert row.last_error == ""
    assert row.result is None
    # Due now, by database time: the same clock reading as created_at.
    assert row.next_execution_at == row.created_at
    assert before - timedelta(seconds=2) <= row.created_at <= after + timedelta(seconds=2)
    for field in Job._meta.concrete_fields:
        assert getattr(job, field.attname) == getattr(row, field.attname), field.name


def test_class_defaults_apply_when_the_call_does_not_override_them():
    job = DispatchStrict.dispatch(5)

    row = Job.objects.get(pk=job.pk)
    assert (row.name, row.queue, row.priority) == (
        "tests.test_dispatch.DispatchStrict",
        "default",
        0,
    )
    assert (row.args, row.kwargs) == ([5], {})


@pytest.mark.parametrize(
    ("queue", "priority"),
    [("other", -100), ("critical", 100), ("a.b:c-d_e", 0), ("x" * 100, 1)],
)
def test_per_call_queue_and_priority_override_the_class_defaults(queue, priority):
    job = DispatchAnything.dispatch("payload", queue=queue, priority=priority)

    row = Job.objects.get(pk=job.pk)
    assert (row.queue, row.priority) == (queue, priority)
    assert (job.queue, job.priority) == (queue, priority)
    # The override is per call: the class keeps its defaults.
    assert (DispatchAnything.queue, DispatchAnything.priority) == ("probe", 7)
    assert Job.objects.get(pk=DispatchAnything.dispatch().pk).priority == 7


@pytest.mark.parametrize(
    "wait",
    [timedelta(hours=2), 7200, 7200.0, 1.5, timedelta(days=3, microseconds=7)],
    ids=["timedelta", "int-seconds", "float-seconds", "fractional-seconds", "micro-timedelta"],
)
def test_wait_schedules_the_job_that_far_from_now(wait):
    delta = wait if isinstance(wait, timedelta) else timedelta(seconds=wait)

    before = timezone.now()
    job = DispatchAnything.dispatch("later", wait=wait)
    after = timezone.now()

    row = Job.objects.get(pk=job.pk)
    assert before + delta <= row.next_execution_at <= after + delta
    assert row.next_execution_at == job.next_execution_at
    assert row.state == JobState.WAITING
    assert row.created_at < row.next_execution_at


@pytest.mark.parametrize("wait", [0, 0.0, timedelta(0)])
def test_a_zero_wait_is_due_now_by_database_time(wait):
    job = DispatchAnything.dispatch(wait=wait)

    row = Job.objects.get(pk=job.pk)
    assert row.next_execution_at == row.created_at


@pytest.mark.parametrize(
    "at",
    [
        datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC),
        datetime(2031, 5, 6, 7, 8, 9, 654321, tzinfo=dt_timezone(timedelta(hours=-5))),
        datetime(
            2031, 12, 31, 23, 59, 59, 999999, tzinfo=dt_timezone(timedelta(hours=5, minutes=30))
        ),
        datetime(2001, 1, 1, tzinfo=UTC),  # in the past: due at once, kept as given
    ],
    ids=["utc", "minus-5h", "plus-5h30", "past"],
)
def test_at_is_stored_exactly(at):
    job = DispatchAnything.dispatch("at", at=at)

    row = Job.objects.get(pk=job.pk)
    assert row.next_execution_at == at
    assert job.next_execution_at == at


def test_job_functions_dispatch_and_stay_callable():
    assert add(2, 3) == 5
    assert dispatch_renamed_function(4, y=2) == 42

    positional = add.dispatch(1, 2)
    keyword = record_kw.dispatch(label="kw")
    renamed = dispatch_renamed_function.dispatch(4, y=2)

    row = Job.objects.get(pk=positional.pk)
    assert (row.name, row.args, row.kwargs) == ("tests.testapp.jobs.add", [1, 2], {})
    assert (row.queue, row.priority) == ("functions", 3)
    row = Job.objects.get(pk=keyword.pk)
    assert (row.name, row.args, row.kwargs) == ("tests.testapp.jobs.record_kw", [], {"label": "kw"})
    assert row.queue == "default"
    row = Job.objects.get(pk=renamed.pk)
    assert (row.name, row.args, row.kwargs) == (
        "tests.test_dispatch.renamed_function",
        [4],
        {"y": 2},
    )
    assert (row.queue, row.priority) == ("fn-queue", -3)


def test_job_functions_check_arguments_against_the_function_signature():
    with pytest.raises(TypeError, match=r"tests\.testapp\.jobs\.add: arguments do not fit.*'b'"):
        add.dispatch(1)
    with pytest.raises(TypeError, match=r"record_kw: arguments do not fit"):
        record_kw.dispatch("positional")
    assert not Job.objects.exists()


def test_float_arguments_come_back_as_the_same_floats():
    values = [0.1, 1e-7, -2.5e-300, 123456789.125, 9.999e15, 2**70]

    job = DispatchAnything.dispatch(*values)

    stored = Job.objects.get(pk=job.pk).args
    assert stored == values
    assert [type(v) for v in stored] == [type(v) for v in values]


@pytest.mark.parametrize("value", [1e16, -2.5e20, 1.5e300])
def test_floats_that_jsonb_would_turn_into_ints_are_refused(value):
    with pytest.raises(TypeError, match=r"^args\[1\] is the float .*pass it as a str or an int"):
        DispatchAnything.dispatch(0.5, value)
    assert not Job.objects.exists()


def test_a_nul_character_is_refused_up_front_and_the_transaction_stays_usable():
    with transaction.atomic():
        with pytest.raises(TypeError, match=r"^kwargs\['note'\] contains the character '\\x00'"):
            DispatchAnything.dispatch(note="a\x00b")
        # The caller's transaction is still usable.
        assert Job.objects.filter(name="nobody").count() == 0
    assert not Job.objects.exists()


def test_a_lone_surrogate_is_refused_with_a_type_error_naming_the_argument():
    with pytest.raises(TypeError, match=r"args\[1\]"):
        DispatchAnything.dispatch("fine", "\ud800")
    assert not Job.objects.exists()


# -- dispatch_many ----------------------------------------------------------------------------


def test_dispatch_many_is_one_insert_and_returns_the_rows_in_input_order():
    arguments = [[i, f"item-{i}"] for i in range(500)]

    with CaptureQueriesContext(connection) as ctx:
        jobs = DispatchAnything.dispatch_many(arguments, queue="bulk", priority=-2)

    assert len(ctx.captured_queries) == 1
    assert ctx.captured_queries[0]["sql"].upper().count("INSERT INTO") == 1
    assert len(jobs) == 500
    ids = [j.pk for j in jobs]
    assert all(isinstance(i, int) for i in ids)
    assert ids == sorted(set(ids))  # distinct and increasing
    assert [j.args for j in jobs] == arguments
    rows = list(Job.objects.filter(pk__in=ids).order_by("id"))
    assert [r.pk for r in rows] == ids
    assert [r.args for r in rows] == arguments  # each id holds its own item
    assert {(r.queue, r.priority, r.state, r.attempts) for r in rows} == {
        ("bulk", -2, JobState.WAITING, 0)
    }
    assert len({r.created_at for r in rows}) == 1  # one statement, one clock reading
    for j, r in zip(jobs, rows, strict=True):
        assert (j.created_at, j.next_execution_at) == (r.created_at, r.next_execution_at)


def test_dispatch_many_takes_lists_as_positional_and_dicts_as_keyword_arguments():
    jobs = DispatchStrict.dispatch_many([[1], {"user_id": 2, "flag": True}, (3,), [4]])

    rows = [Job.objects.get(pk=j.pk) for j in jobs]
    assert [(r.args, r.kwargs) for r in rows] == [
        ([1], {}),
        ([], {"user_id": 2, "flag": True}),
        ([3], {}),
        ([4], {}),
    ]
    assert add.dispatch_many([[1, 2], {"a": 3, "b": 4}])[1].kwargs == {"a": 3, "b": 4}


def test_dispatch_many_applies_wait_to_every_row():
    before = timezone.now()
    jobs = DispatchAnything.dispatch_many([[1], [2]], wait=60)
    after = timezone.now()

    for row in Job.objects.filter(pk__in=[j.pk for j in jobs]):
        assert (
            before + timedelta(seconds=60) <= row.next_execution_at <= after + timedelta(seconds=60)
        )


@pytest.mark.parametrize("empty", [[], (), iter([])], ids=["list", "tuple", "iterator"])
def test_dispatch_many_of_nothing_returns_an_empty_list_without_a_query(
    empty, django_assert_num_queries
):
    with django_assert_num_queries(0):
        assert DispatchAnything.dispatch_many(empty) == []


@pytest.mark.parametrize("index", [0, 250, 499])
@pytest.mark.parametrize(
    ("bad", "error", "pattern"),
    [
        ([{1, 2}], TypeError, r"args\[0\] is a set"),
        ({"user_id": datetime(2030, 1, 1, tzinfo=UTC)}, TypeError, r"kwargs\['user_id'\]"),
        ("not-a-list", TypeError, r"is a str; pass a list"),
        (42, TypeError, r"is an int; pass a list"),
        ([1, 2], TypeError, r"arguments do not fit handle\(\)"),
        ({"user_id": 1, "nope": 1}, TypeError, r"unexpected keyword argument 'nope'"),
        (["x" * 200], PayloadTooLarge, r"GATOR_MAX_PAYLOAD_BYTES=100"),
    ],
    ids=["set", "datetime-kwarg", "str-item", "int-item", "too-many-args", "bad-kwarg", "size"],
)
def test_a_bad_item_anywhere_inserts_nothing_and_names_its_index(
    settings, index, bad, error, pattern
):
    settings.GATOR_MAX_PAYLOAD_BYTES = 100
    arguments: list[Any] = [[i] for i in range(500)]
    arguments[index] = bad

    with pytest.raises(error, match=pattern) as excinfo:
        DispatchStrict.dispatch_many(arguments)

    assert f"item {index}" in str(excinfo.value)
    assert not Job.objects.exists()


def test_a_one_item_dispatch_many_also_names_the_bad_items_index():
    with pytest.raises(TypeError, match=r"item 0"):
        DispatchStrict.dispatch_many([[{1, 2}]])
    assert not Job.objects.exists()


class Flag(int):
    """An int subclass: accepted, checked one by one rather than by column."""


#: Values the column checks of dispatch_many cannot clear at once, all of them valid.
LOOK_SUSPECT_BUT_VALID: list[Any] = [
    "a literal \\u0000, not a NUL",
    "see e+5",
    1e15,
    -9999999999999998.0,
    2**100,
    Flag(3),
    "é \U0001f40a",
    ["nested", {"deep": [1, 2.5, None]}],
]


def test_values_the_column_checks_cannot_clear_are_checked_one_by_one_and_kept():
    arguments: list[Any] = [[i] for i in range(300)]
    for index, value in enumerate(LOOK_SUSPECT_BUT_VALID):
        arguments[40 * index + 7] = [value]
    arguments[299] = {"user_id": 2**70, "flag": True}

    jobs = DispatchAnything.dispatch_many(arguments)

    stored = dict(Job.objects.values_list("pk", "args"))
    for returned, item in zip(jobs, arguments, strict=True):
        if isinstance(item, dict):
            assert Job.objects.get(pk=returned.pk).kwargs == item == returned.kwargs
        else:
            assert stored[returned.pk] == item == returned.args


@pytest.mark.parametrize(
    ("items", "index", "pattern"),
    [
        ([[1], [1, 2], [float("nan")]], 1, r"arguments do not fit handle\(\)"),
        ([[1], [float("nan")], [1, 2]], 1, r"args\[0\] is nan"),
        ([["e+"], ["\x00"], [1, 2]], 1, r"contains the character '\\x00'"),
        ([[1], [1e16], [1, 2]], 1, r"the float 1e\+16"),
        ([[2**14001]], 0, r"an int of 14002 bits"),
        ([[1], [["\ud800"]]], 1, r"args\[0\]\[0\] contains the character '\\ud800'"),
        ([[1], [{7: 2}]], 1, r"args\[0\] has the key 7 of type int"),
    ],
    ids=["misfit-first", "json-first", "nul", "big-float", "huge-int", "nested-surrogate", "key"],
)
def test_the_first_bad_item_is_named_whichever_check_finds_it(items, index, pattern):
    arguments = [[i] for i in range(200)] + items
    with pytest.raises(TypeError, match=pattern) as excinfo:
        DispatchStrict.dispatch_many(arguments)
    assert str(excinfo.value).startswith(f"dispatch_many() item {200 + index}: ")
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_database_error_anywhere_in_a_large_dispatch_many_inserts_nothing(monkeypatch):
    # Force the rows into several statements (normally one): they share one transaction.
    monkeypatch.setattr(type(get_engine("default")), "insert_bytes", 2000)
    arguments = [[i] for i in range(499)] + [["poison-marker"]]

    def fail_on_the_last_item(execute, sql, params, many, context):
        if "poison-marker" in repr(params):
            raise OperationalError("simulated: connection lost while inserting the last item")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(fail_on_the_last_item), pytest.raises(OperationalError):
        DispatchAnything.dispatch_many(arguments)

    assert Job.objects.count() == 0


# -- transactions -------------------------------------------------------------------------


def test_a_rolled_back_savepoint_takes_the_job_with_it():
    kept = DispatchAnything.dispatch("kept")
    with rolled_back():
        dropped = DispatchAnything.dispatch("dropped")
        assert Job.objects.filter(pk=dropped.pk).exists()

    assert list(Job.objects.values_list("pk", flat=True)) == [kept.pk]


@pytest.mark.django_db(transaction=True)
def test_the_row_is_written_in_the_callers_transaction():
    with transaction.atomic():
        job = DispatchAnything.dispatch("tx")
        assert Job.objects.filter(pk=job.pk).exists()
        assert not seen_from_another_connection(job.pk)
    assert seen_from_another_connection(job.pk)

    with rolled_back():
        gone = DispatchAnything.dispatch_many([["a"], ["b"]])
        assert Job.objects.count() == 3
    assert all(j.pk is not None for j in gone)
    assert list(Job.objects.values_list("pk", flat=True)) == [job.pk]
    assert not any(seen_from_another_connection(j.pk) for j in gone)


@postgres_only
@pytest.mark.django_db(transaction=True)
@override_settings(GATOR_NOTIFY=True)  # the default (the suite may run with it off)
def test_postgres_row_and_wakeup_are_invisible_to_others_until_commit(pg_listener):
    def count(pk: int | None) -> int:
        return pg_listener.execute(
            "SELECT count(*) FROM django_gator_job WHERE id = %s", [pk]
        ).fetchone()[0]

    with transaction.atomic():
        now = DispatchAnything.dispatch("now")
        DispatchAnything.dispatch("also now")
        bulk = DispatchAnything.dispatch_many([[1], [2]], queue="bulk")
        later = DispatchAnything.dispatch("later", queue="scheduled-only", wait=3600)
        assert count(now.pk) == 0
        assert [count(j.pk) for j in bulk] == [0, 0]
        assert list(pg_listener.notifies(timeout=0.2)) == []

    assert count(now.pk) == 1
    assert [count(j.pk) for j in bulk] == [1, 1]
    assert count(later.pk) == 1
    notes = list(pg_listener.notifies(timeout=0.5))
    # One wakeup per queue with work due now; none for the scheduled-only queue.
    assert sorted(n.payload for n in notes) == ["bulk", "probe"]


def prepared_inserts() -> int:
    """Statements this session has prepared on the server that insert jobs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements "
            "WHERE statement LIKE 'INSERT INTO %%django_gator_job%%'"
        )
        return int(cursor.fetchone()[0])


@contextmanager
def connection_options(**options: Any) -> Iterator[None]:
    """The default connection reopened with these OPTIONS, then as it was."""
    saved = dict(connection.settings_dict["OPTIONS"])
    connection.close()
    connection.settings_dict["OPTIONS"].update(options)
    connection.features.__dict__.pop("uses_server_side_binding", None)
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["OPTIONS"] = saved
        connection.features.__dict__.pop("uses_server_side_binding", None)


@postgres_only
@pytest.mark.django_db(transaction=True)
@override_settings(GATOR_NOTIFY=True)  # the default (the suite may run with it off)
def test_postgres_dispatch_runs_prepared_with_server_side_binding(pg_listener):
    """Django binds on the client and turns psycopg's prepared statements off by default;
    with both turned on, dispatch's statements work, the single INSERT runs prepared, and
    its NOTIFY still rides along."""
    with connection_options(server_side_binding=True, prepare_threshold=5):
        jobs = [DispatchAnything.dispatch(i, priority=1) for i in range(8)]
        assert prepared_inserts() == 1  # psycopg prepared it at its 5th run
        assert len(list(pg_listener.notifies(timeout=0.5))) == 8
        jobs += DispatchAnything.dispatch_many([[8], {"nine": 9}], wait=60)  # unnest()
        jobs += DispatchStrict.dispatch_many(
            [[i] for i in range(1000)], at=datetime(2030, 1, 1, tzinfo=UTC)
        )
    rows = {row.pk: row for row in Job.objects.all()}
    assert len(rows) == len(jobs) == 1010
    for made in jobs:
        row = rows[made.pk]
        assert (row.args, row.kwargs, row.priority) == (made.args, made.kwargs, made.priority)
        assert (row.created_at, row.next_execution_at) == (made.created_at, made.next_execution_at)
    assert rows[jobs[9].pk].kwargs == {"nine": 9}


@postgres_only
@pytest.mark.django_db(transaction=True)
@override_settings(GATOR_NOTIFY=True)  # the default (the suite may run with it off)
def test_postgres_single_dispatch_is_prepared_on_a_direct_alias_only(pg_listener, settings):
    """With Django's defaults the single INSERT is still prepared, once per connection, on
    a cursor kept with it: its rows, timestamps and NOTIFY are as before. Not behind a
    transaction pooler, nor while queries are logged (their SQL is then in the log)."""
    from django.test.utils import CaptureQueriesContext

    connection.close()
    jobs = [DispatchAnything.dispatch(i) for i in range(3)]
    jobs.append(DispatchAnything.dispatch(3, wait=60))
    assert prepared_inserts() == 2  # due now, and scheduled: one statement each
    assert len(list(pg_listener.notifies(timeout=0.5))) == 3
    for made in jobs:
        row = Job.objects.get(pk=made.pk)
        assert (row.args, row.created_at, row.next_execution_at) == (
            made.args,
            made.created_at,
            made.next_execution_at,
        )
    assert jobs[0].next_execution_at == jobs[0].created_at
    assert jobs[3].next_execution_at > jobs[3].created_at
    with CaptureQueriesContext(connection) as queries:
        logged = DispatchAnything.dispatch("logged")
    assert [q["sql"] for q in queries.captured_queries if "INSERT" in q["sql"]]
    assert Job.objects.get(pk=logged.pk).args == ["logged"]
    connection.close()
    settings.GATOR_POOLED_DATABASES = ["default"]
    pooled = DispatchAnything.dispatch("pooled")
    assert prepared_inserts() == 0
    assert Job.objects.get(pk=pooled.pk).created_at == pooled.created_at


@postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("use_tz", "zone"), [(True, "America/Chicago"), (False, "America/Chicago"), (False, "UTC")]
)
def test_postgres_single_dispatch_timestamps_read_as_djangos_own(use_tz, zone):
    """The kept cursor reads the INSERT's timestamps in binary; they come back as Django's
    cursors give them, also after the session's time zone changed under that cursor
    (aware in the connection's zone with USE_TZ, naive in TIME_ZONE without)."""
    from django.test import override_settings

    DispatchAnything.dispatch("before")  # the kept cursor made with the suite's settings
    with override_settings(USE_TZ=use_tz, TIME_ZONE=zone):
        made = [DispatchAnything.dispatch("now"), DispatchAnything.dispatch("later", wait=90)]
        for job in made:
            row = Job.objects.get(pk=job.pk)
            assert (job.created_at, job.next_execution_at) == (
                row.created_at,
                row.next_execution_at,
            )
            assert job.created_at.tzinfo == row.created_at.tzinfo
            assert (job.created_at.tzinfo is None) is not use_tz
    connection.close()  # its session's time zone was the override's


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_postgres_rolled_back_dispatch_wakes_nobody(pg_listener):
    with rolled_back():
        DispatchAnything.dispatch("never")

    assert list(pg_listener.notifies(timeout=0.3)) == []
    assert pg_listener.execute("SELECT count(*) FROM django_gator_job").fetchone()[0] == 0


def test_on_commit_defers_the_insert_until_the_transaction_commits(
    django_capture_on_commit_callbacks,
):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        job = DispatchAnything.dispatch("deferred", on_commit=True)
        many = DispatchAnything.dispatch_many([["m1"], ["m2"]], on_commit=True)
        assert job.pk is None
        assert [j.pk for j in many] == [None, None]
        assert (job.args, job.queue, job.state) == (["deferred"], "probe", JobState.WAITING)
        assert not Job.objects.exists()

    assert len(callbacks) == 2
    assert job.pk is not None
    assert job._state.adding is False
    row = Job.objects.get(pk=job.pk)
    assert (row.args, row.queue, row.priority) == (["deferred"], "probe", 7)
    assert (row.created_at, row.next_execution_at) == (job.created_at, job.next_execution_at)
    assert [Job.objects.get(pk=j.pk).args for j in many] == [["m1"], ["m2"]]
    assert many[0].pk < many[1].pk


@pytest.mark.django_db(transaction=True)
def test_on_commit_waits_for_the_outermost_block_and_drops_the_job_on_rollback():
    with transaction.atomic():
        with transaction.atomic():
            job = DispatchAnything.dispatch("nested", on_commit=True)
        assert job.pk is None
        assert not Job.objects.exists()
    assert job.pk is not None
    assert Job.objects.get(pk=job.pk).args == ["nested"]

    with rolled_back():
        dropped = DispatchAnything.dispatch("dropped", on_commit="default")
    assert dropped.pk is None
    assert list(Job.objects.values_list("pk", flat=True)) == [job.pk]

    # Outside any transaction (autocommit) the insert happens at once.
    immediate = DispatchAnything.dispatch("autocommit", on_commit=True)
    assert immediate.pk is not None
    assert seen_from_another_connection(immediate.pk)


def test_the_on_commit_setting_is_the_default_and_the_argument_wins(
    settings, django_capture_on_commit_callbacks
):
    settings.GATOR_DISPATCH_ON_COMMIT = True
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        deferred = DispatchAnything.dispatch("by setting")
        immediate = DispatchAnything.dispatch("explicit", on_commit=False)

    assert len(callbacks) == 1
    assert deferred.pk is None
    assert immediate.pk is not None
    assert list(Job.objects.values_list("args", flat=True)) == [["explicit"]]


# -- bad input: refused with a clear error, nothing inserted --------------------------------


@pytest.mark.parametrize(
    ("call", "where", "what"),
    [
        (
            lambda: DispatchAnything.dispatch(datetime(2030, 1, 1, tzinfo=UTC)),
            "args[0]",
            "datetime.datetime",
        ),
        (lambda: DispatchAnything.dispatch(1, Decimal("1.50")), "args[1]", "decimal.Decimal"),
        (lambda: DispatchAnything.dispatch({1, 2}), "args[0]", "is a set"),
        (lambda: DispatchAnything.dispatch(b"raw"), "args[0]", "is a bytes"),
        (
            lambda: DispatchAnything.dispatch(JobFactory.build()),
            "args[0]",
            "django_gator.models.jobs.Job",  # the class, where it is defined
        ),
        (lambda: DispatchAnything.dispatch(float("nan")), "args[0]", "nan"),
        (lambda: DispatchAnything.dispatch(x=float("inf")), "kwargs['x']", "inf"),
        (lambda: DispatchAnything.dispatch([-float("inf")]), "args[0][0]", "-inf"),
        (lambda: DispatchAnything.dispatch((1, 2)), "args[0]", "tuples come back as lists"),
        (lambda: DispatchAnything.dispatch({1: "one"}), "args[0]", "key 1 of type int"),
        (lambda: DispatchAnything.dispatch({"a": {None: 1}}), "args[0]['a']", "key None"),
        (
            lambda: DispatchAnything.dispatch({"when": date(2030, 1, 1)}),
            "args[0]['when']",
            "datetime.date",
        ),
        (
            lambda: DispatchAnything.dispatch(payload={"a": [1, {"b": [2, 3, frozenset()]}]}),
            "kwargs['payload']['a'][1]['b'][2]",
            "frozenset",
        ),
        (
            lambda: DispatchAnything.dispatch([[[[[[object()]]]]]]),
            "args[0][0][0][0][0][0][0]",
            "object",
        ),
    ],
    ids=[
        "datetime",
        "decimal",
        "set",
        "bytes",
        "model-instance",
        "nan",
        "inf-kwarg",
        "minus-inf-nested",
        "tuple",
        "int-key",
        "none-key-nested",
        "date-nested",
        "deep-frozenset",
        "deep-object",
    ],
)
def test_non_json_arguments_are_refused_naming_path_and_type(call, where, what):
    with pytest.raises(TypeError) as excinfo:
        call()

    message = str(excinfo.value)
    assert message.startswith(where + " ")
    assert what in message
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("args", "kwargs", "pattern"),
    [
        ((), {}, r"missing a required argument: 'user_id'"),
        ((1, 2), {}, r"too many positional arguments"),
        ((1,), {"nope": 3}, r"unexpected keyword argument 'nope'"),
        ((1,), {"user_id": 1}, r"multiple values for argument 'user_id'"),
    ],
)
def test_arguments_that_do_not_fit_handle_are_a_type_error_from_binding(args, kwargs, pattern):
    with pytest.raises(TypeError, match=r"^tests\.test_dispatch\.DispatchStrict: .*" + pattern):
        DispatchStrict.dispatch(*args, **kwargs)
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        ({"at": datetime(2030, 1, 1, 12, 0)}, r"at= must be timezone-aware.*2030-01-01T12:00:00"),
        ({"at": "2030-01-01T00:00:00Z"}, r"at= must be a datetime, got '2030-01-01T00:00:00Z'"),
        ({"at": date(2030, 1, 1)}, r"at= must be a datetime"),
        ({"wait": -1}, r"wait= must be zero or positive.*-1"),
        ({"wait": -0.001}, r"wait= must be zero or positive.*-0\.001"),
        (
            {"wait": timedelta(seconds=-5)},
            r"wait= must be zero or positive.*days=-1, seconds=86395",
        ),
        ({"wait": float("nan")}, r"wait= must be zero or positive.*nan"),
        ({"wait": float("inf")}, r"wait= must be zero or positive.*inf"),
        ({"wait": "60"}, r"wait= must be a timedelta or a number of seconds, got '60'"),
        ({"wait": True}, r"wait= must be a timedelta or a number of seconds, got True"),
        (
            {"wait": 60, "at": datetime(2030, 1, 1, tzinfo=UTC)},
            r"pass either wait= or at=, not both",
        ),
        ({"priority": 101}, r"priority 101 is out of range"),
        ({"priority": -101}, r"priority -101 is out of range"),
        ({"priority": 32767}, r"priority 32767 is out of range"),
        ({"priority": 1.5}, r"priority must be an int, got 1\.5"),
        ({"priority": "5"}, r"priority must be an int, got '5'"),
        ({"priority": True}, r"priority must be an int, got True"),
        ({"queue": ""}, r"invalid queue name ''"),
        ({"queue": "a,b"}, r"invalid queue name 'a,b'"),
        ({"queue": "with space"}, r"invalid queue name 'with space'"),
        ({"queue": "new\nline"}, r"invalid queue name 'new\\nline'"),
        ({"queue": "q" * 101}, r"invalid queue name 'qqqqqqqqqq"),
        ({"queue": 42}, r"queue name must be a str, got 42"),
        ({"queue": b"bytes"}, r"queue name must be a str, got b'bytes'"),
    ],
)
def test_bad_options_are_a_value_error_naming_the_value(options, pattern):
    with pytest.raises(ValueError, match=pattern):
        DispatchAnything.dispatch("x", **options)
    with pytest.raises(ValueError, match=pattern):
        DispatchAnything.dispatch_many([["y"], ["z"]], **options)
    assert not Job.objects.exists()


def test_payload_size_limit_is_exact_and_refuses_without_inserting(settings):
    settings.GATOR_MAX_PAYLOAD_BYTES = 100
    # '["' + 94 chars + '"]' is 98 bytes, '{}' is 2: exactly 100.
    DispatchAnything.dispatch("x" * 94)
    # 'é' is two bytes in UTF-8: 47 of them are 94 bytes.
    DispatchAnything.dispatch("é" * 47)
    assert Job.objects.count() == 2

    for call in (
        lambda: DispatchAnything.dispatch("x" * 95),
        lambda: DispatchAnything.dispatch("é" * 48),
        lambda: DispatchAnything.dispatch(big="x" * 50, more="y" * 50),
    ):
        with pytest.raises(PayloadTooLarge, match=r"over GATOR_MAX_PAYLOAD_BYTES=100") as exc:
            call()
        assert isinstance(exc.value, ValueError)
    with pytest.raises(PayloadTooLarge, match=r"^job payload is 101 bytes"):
        DispatchAnything.dispatch("x" * 95)
    assert Job.objects.count() == 2


def test_the_default_payload_limit_is_one_mebibyte():
    with pytest.raises(PayloadTooLarge, match=r"GATOR_MAX_PAYLOAD_BYTES=1048576"):
        DispatchAnything.dispatch("x" * (1_048_576 - 5))
    assert not Job.objects.exists()


# -- database constraints -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "constraint"),
    [
        ({"priority": 500}, "gator_job_priority_range"),
        ({"priority": -101}, "gator_job_priority_range"),
        ({"queue": ""}, "gator_job_queue_not_empty"),
        ({"name": ""}, "gator_job_name_not_empty"),
        ({"state": "bogus"}, "gator_job_state_valid"),
        ({"state": JobState.RUNNING}, "gator_job_running_is_reserved"),
    ],
)
def test_the_database_refuses_rows_that_break_a_named_constraint(fields, constraint):
    values = {"name": "tests.testapp.jobs.Noop", **fields}

    with pytest.raises(IntegrityError) as excinfo, transaction.atomic():
        Job.objects.create(**values)

    if PARTITIONED_SUITE and constraint == "gator_job_state_valid":
        # Partitioned storage: no partition takes an unknown state, before the check.
        constraint = "no partition of relation"
    assert constraint in str(excinfo.value)
    assert not Job.objects.exists()


def test_the_constraints_accept_the_edges_of_the_valid_range():
    Job.objects.create(name="n", priority=100, queue="q" * 100)
    Job.objects.create(name="n" * 255, priority=-100, queue="q")
    Job.objects.create(name="n", state=JobState.RUNNING, reserved_by="w", locked_at=timezone.now())
    assert Job.objects.count() == 3


@pytest.mark.parametrize(
    ("trait", "state"),
    [
        ({}, JobState.WAITING),
        ({"scheduled": True}, JobState.WAITING),
        ({"running": True}, JobState.RUNNING),
        ({"lost": True}, JobState.RUNNING),
        ({"succeeded": True}, JobState.SUCCEEDED),
        ({"failed": True, "attempts": 5}, JobState.FAILED),
        ({"dead": True, "attempts": 3}, JobState.DEAD),
        ({"cancelled": True}, JobState.CANCELLED),
    ],
    ids=["waiting", "scheduled", "running", "lost", "succeeded", "failed", "dead", "cancelled"],
)
def test_factory_rows_are_valid_rows_in_their_state(trait, state):
    made = JobFactory(**trait)

    row = Job.objects.get(pk=made.pk)
    assert row.state == state
    assert row.is_final == (state in (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED))
    if state in (JobState.FAILED, JobState.DEAD):
        assert [e["attempt"] for e in row.error_history] == list(range(1, row.attempts + 1))
        assert row.last_error == f"RuntimeError: attempt {row.attempts} failed"
    if state == JobState.RUNNING:
        assert row.reserved_by
        assert row.locked_at is not None
    if trait.get("running"):
        assert row.reserved_by == FACTORY_WORKER
    if trait.get("scheduled") or trait.get("failed"):
        assert Job.objects.scheduled().filter(pk=row.pk).exists()
        assert not Job.objects.ready().filter(pk=row.pk).exists()


def test_the_deepest_nesting_accepted_is_stored_by_every_database():
    from django_gator.validation import MAX_DEPTH

    deepest: Any = 1
    for _ in range(MAX_DEPTH - 1):  # args itself is the outermost level
        deepest = [deepest]
    stored = add.dispatch(deepest, 0)
    assert Job.objects.get(pk=stored.pk).args == [deepest, 0]

    with pytest.raises(TypeError, match=rf"^args\[0\]\[0\].* is nested deeper than {MAX_DEPTH}"):
        add.dispatch([deepest], 0)
    assert Job.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("on_commit", [False, True])
def test_a_large_dispatch_many_refuses_a_late_bad_item_with_nothing_inserted(on_commit):
    """Above encoding.STREAM_MIN_ROWS the arguments may be checked while the rows are sent
    (PostgreSQL's COPY); wherever they are checked, a bad last item is refused by the call,
    with nothing inserted, and named by its index."""
    from django_gator.pipeline.encoding import STREAM_MIN_ROWS

    count = STREAM_MIN_ROWS + 10
    items: list[Any] = [[i, i] for i in range(count)]
    items[-1] = [{"when": date(2026, 1, 1)}, 1]  # fits add(a, b); not JSON
    with pytest.raises(TypeError, match=rf"dispatch_many\(\) item {count - 1}: "):
        add.dispatch_many(items, on_commit=on_commit)
    with (
        transaction.atomic(),
        pytest.raises(TypeError, match=rf"dispatch_many\(\) item {count - 1}: "),
    ):
        add.dispatch_many(items, on_commit=on_commit)
    assert not Job.objects.exists()
    assert len(add.dispatch_many([[i, 1] for i in range(count)])) == count
