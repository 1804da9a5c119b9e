"""PostgreSQL: a large dispatch_many goes through COPY. Same rows, same returned jobs, same
transaction and NOTIFY behaviour as the INSERT it replaces."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import DataError, OperationalError, connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_gator import Queueable
from django_gator.engines import postgresql_copy
from django_gator.models import Job, JobState
from django_gator.pipeline import encoding

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="COPY is PostgreSQL's"),
]

ROWS = postgresql_copy.COPY_MIN_ROWS + 7

#: Arguments COPY's text format has to escape, and some it does not.
AWKWARD = [
    "tab\there",
    "new\nline",
    "carriage\rreturn",
    "back\\slash",
    "\\N",
    "quote \" and 'single'",
    "unicode é ✓ 🐊",
    "",
    None,
    {"nested": ["a\tb", {"c": "d\\e"}]},
]


class CopyProbe(Queueable):
    queue = "copy-probe"
    priority = 3

    def handle(self, *args: Any, **kwargs: Any) -> None:
        return None


class CopyUnique(Queueable):
    queue = "copy-unique"
    unique = True

    def handle(self, n: int) -> None:
        return None


def sent_copy(queries: list[dict[str, str]]) -> bool:
    """COPY itself goes around Django's query log: what it shows is the ids reserved from
    the sequence and no INSERT."""
    sql = [q["sql"] for q in queries]
    return any("nextval(" in s for s in sql) and not any("INSERT" in s for s in sql)


def test_a_large_dispatch_many_returns_every_row_as_stored():
    from django.test.utils import CaptureQueriesContext

    items: list[Any] = [[i, AWKWARD[i % len(AWKWARD)]] for i in range(ROWS)]
    items[5] = {"kw": "tab\tand\\slash", "n": 5}
    with CaptureQueriesContext(connection) as queries:
        jobs = CopyProbe.dispatch_many(items)
    assert sent_copy(queries.captured_queries)
    assert len(jobs) == ROWS
    ids = [job.pk for job in jobs]
    assert ids == sorted(ids)
    assert len(set(ids)) == ROWS
    stored = {job.pk: job for job in Job.objects.filter(queue="copy-probe")}
    assert len(stored) == ROWS
    for job, item in zip(jobs, items, strict=True):
        row = stored[job.pk]
        if isinstance(item, dict):
            assert (row.args, row.kwargs) == ([], item)
        else:
            assert (row.args, row.kwargs) == (item, {})
        assert (row.name, row.queue, row.priority, row.state) == (
            CopyProbe.name,
            "copy-probe",
            3,
            JobState.WAITING,
        )
        assert (row.attempts, row.rescues, row.last_error, row.chain_id) == (0, 0, "", None)
        assert row.created_at == job.created_at
        assert row.next_execution_at == job.next_execution_at == row.created_at
        assert (job.args, job.kwargs) == (row.args, row.kwargs)
        assert not job._state.adding


def test_wait_and_at_apply_to_every_copied_row():
    at = timezone.now() + timedelta(hours=2)
    jobs = CopyProbe.dispatch_many([[i] for i in range(ROWS)], at=at, queue="later")
    assert {job.next_execution_at for job in jobs} == {at}
    assert set(Job.objects.filter(queue="later").values_list("next_execution_at", flat=True)) == {
        at
    }


@override_settings(GATOR_NOTIFY=True)  # the default (the suite may run with it off)
def test_copied_rows_and_their_notify_wait_for_the_commit(pg_listener):
    with transaction.atomic():
        jobs = CopyProbe.dispatch_many([[i] for i in range(ROWS)])
        seen = pg_listener.execute(
            "SELECT count(*) FROM django_gator_job WHERE id = %s", [jobs[0].pk]
        ).fetchone()[0]
        assert seen == 0
        assert list(pg_listener.notifies(timeout=0.2)) == []
    assert [n.payload for n in pg_listener.notifies(timeout=1.0, stop_after=1)] == ["copy-probe"]
    assert Job.objects.filter(queue="copy-probe").count() == ROWS

    with transaction.atomic():
        CopyProbe.dispatch_many([[i] for i in range(ROWS)], queue="rolled-back")
        transaction.set_rollback(True)
    assert not Job.objects.filter(queue="rolled-back").exists()
    assert list(pg_listener.notifies(timeout=0.3)) == []


def test_a_copy_that_fails_midway_inserts_nothing(monkeypatch):
    """The lines go out a chunk at a time: a failure while the third chunk is built, after
    two were sent, leaves no row behind and the connection usable."""
    monkeypatch.setattr(postgresql_copy, "COPY_CHUNK", 200)
    original = postgresql_copy._copy_json
    calls = {"n": 0}

    def fails_later(values: list[str]) -> list[str]:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OperationalError("simulated: the connection broke during COPY")
        return original(values)

    monkeypatch.setattr(postgresql_copy, "_copy_json", fails_later)
    with pytest.raises(OperationalError, match="simulated"):
        CopyProbe.dispatch_many([[i, f"x{i}"] for i in range(ROWS)])
    assert calls["n"] == 3
    assert not Job.objects.exists()
    monkeypatch.setattr(postgresql_copy, "_copy_json", original)
    assert len(CopyProbe.dispatch_many([[i] for i in range(ROWS)])) == ROWS
    assert Job.objects.count() == ROWS


def test_a_row_the_server_refuses_midway_rolls_back_only_the_copy(monkeypatch):
    """PostgreSQL refuses a line of the third chunk (not JSON): the error is Django's
    DataError, nothing of the COPY is stored, and the caller's transaction goes on."""
    monkeypatch.setattr(postgresql_copy, "COPY_CHUNK", 200)
    original = postgresql_copy._copy_json
    calls = {"n": 0}

    def spoils_a_line(values: list[str]) -> list[str]:
        calls["n"] += 1
        texts = original(values)
        if calls["n"] == 3:
            texts[10] = "{not json"
        return texts

    monkeypatch.setattr(postgresql_copy, "_copy_json", spoils_a_line)
    with transaction.atomic():
        kept = CopyProbe.dispatch(-1)
        with pytest.raises(DataError):
            CopyProbe.dispatch_many([[i] for i in range(ROWS)])
        after = CopyProbe.dispatch(-2)
    assert list(Job.objects.order_by("id").values_list("id", flat=True)) == [kept.pk, after.pk]


def test_unique_jobs_keep_their_own_insert():
    first = CopyUnique.dispatch_many([[i] for i in range(ROWS)])
    again = CopyUnique.dispatch_many([[i] for i in range(ROWS)])
    assert [j.pk for j in again] == [j.pk for j in first]
    assert Job.objects.filter(queue="copy-unique").count() == ROWS


# -- arguments checked and encoded while the COPY streams (encoding.STREAM_MIN_ROWS) --------
STREAMED = encoding.STREAM_MIN_ROWS + 1500


def test_a_streamed_dispatch_many_stores_what_the_eager_one_would(monkeypatch):
    """Above STREAM_MIN_ROWS the arguments are encoded chunk by chunk as the COPY sends
    them: the same rows as when they are encoded first (the awkward values, nested ones and
    keyword arguments included)."""
    monkeypatch.setattr(postgresql_copy, "COPY_CHUNK", 700)  # several chunks
    items: list[Any] = [[i, AWKWARD[i % len(AWKWARD)]] for i in range(STREAMED)]
    items[3000] = {"kw": "tab\tand\\slash", "n": 3000}
    encoded: list[tuple[int, int]] = []
    original = encoding._encode_range

    def spy(*args: Any) -> None:
        encoded.append(args[-2:])
        original(*args)

    monkeypatch.setattr(encoding, "_encode_range", spy)
    jobs = CopyProbe.dispatch_many(items)
    assert encoded == [(start, min(start + 700, STREAMED)) for start in range(0, STREAMED, 700)]
    stored = dict(Job.objects.filter(queue="copy-probe").values_list("id", "args"))
    kwargs = dict(Job.objects.filter(queue="copy-probe").values_list("id", "kwargs"))
    assert len(stored) == STREAMED
    for job, item in zip(jobs, items, strict=True):
        if isinstance(item, dict):
            assert (stored[job.pk], kwargs[job.pk]) == ([], item)
        else:
            assert (stored[job.pk], kwargs[job.pk]) == (item, {})


def test_a_bad_item_found_while_streaming_is_refused_with_nothing_inserted(monkeypatch):
    """The bad item is in the last chunk, after the others were sent: the error names it as
    the eager check would, the COPY ends with nothing stored, the caller's transaction and
    the connection go on."""
    monkeypatch.setattr(postgresql_copy, "COPY_CHUNK", 700)
    items: list[Any] = [[i] for i in range(STREAMED)]
    items[-3] = [{1, 2}]  # a set: not JSON
    with pytest.raises(TypeError) as streamed:
        CopyProbe.dispatch_many(items)
    assert not Job.objects.exists()
    # The same refusal, item for item, as a call small enough to be checked first.
    with pytest.raises(TypeError) as eager:
        CopyProbe.dispatch_many(items[-100:])
    index = STREAMED - 3
    assert str(streamed.value) == str(eager.value).replace("item 97:", f"item {index}:")
    assert str(streamed.value).startswith(f"dispatch_many() item {index}: ")
    with transaction.atomic():
        kept = CopyProbe.dispatch(-1)
        with pytest.raises(TypeError, match=rf"item {index}: args\[0\] is nan"):
            CopyProbe.dispatch_many([[i] for i in range(index)] + [[float("nan")]], on_commit=False)
        after = CopyProbe.dispatch(-2)
    assert list(Job.objects.order_by("id").values_list("id", flat=True)) == [kept.pk, after.pk]


def test_a_streamed_dispatch_deferred_to_the_commit_is_checked_at_the_call():
    items: list[Any] = [[i] for i in range(STREAMED)]
    items[-1] = [object()]
    with transaction.atomic():
        with pytest.raises(TypeError, match=f"item {STREAMED - 1}:"):
            CopyProbe.dispatch_many(items, on_commit=True)
        CopyProbe.dispatch(-1, on_commit=True)
    assert Job.objects.count() == 1


class CopyKeyed(Queueable):
    queue = "copy-keyed"
    concurrency_limit = 2

    def concurrency_key(self, n: int) -> str:
        return f"key-{n % 7}"

    def handle(self, n: int) -> None:
        return None


@pytest.mark.parametrize("job_class", [CopyProbe, CopyKeyed])
def test_the_returned_jobs_are_built_a_chunk_at_a_time_as_the_lines_go_out(monkeypatch, job_class):
    """The Job objects of each chunk are built once its lines are sent (while PostgreSQL
    reads them), in order; each still matches its own row, keys included."""
    from django_gator.pipeline.jobs import JobsInsert

    monkeypatch.setattr(postgresql_copy, "COPY_CHUNK", 200)
    original = JobsInsert.prepare
    built: list[int] = []

    def noted(self: JobsInsert, stop: int | None = None) -> None:
        original(self, stop)
        built.append(len(self.jobs))

    monkeypatch.setattr(JobsInsert, "prepare", noted)
    jobs = job_class.dispatch_many([[i] for i in range(ROWS)])
    assert built == [*range(200, ROWS, 200), ROWS]
    stored = {job.pk: job for job in Job.objects.all()}
    assert len(stored) == ROWS
    for i, job in enumerate(jobs):
        row = stored[job.pk]
        assert row.args == job.args == [i]
        assert row.concurrency_key == job.concurrency_key
        assert row.created_at == job.created_at == job.next_execution_at
    if job_class is CopyKeyed:
        assert {job.concurrency_key for job in jobs} == {f"key-{n}" for n in range(7)}
