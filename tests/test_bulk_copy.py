"""PostgreSQL: a large dispatch_many goes through COPY. Same rows, same returned jobs, same
transaction and NOTIFY behaviour as the INSERT it replaces."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from django_gator import Queueable
from django_gator.engines import postgresql
from django_gator.models import Job, JobState

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="COPY is PostgreSQL's"),
]

ROWS = postgresql.COPY_MIN_ROWS + 7

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
    return any("nextval(pg_get_serial_sequence" in s for s in sql) and not any(
        "INSERT" in s for s in sql
    )


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


def test_a_failed_copy_inserts_nothing(monkeypatch):
    def broken(value: Any, null: str) -> str:
        raise OperationalError("simulated: the connection broke during COPY")

    original = postgresql._copy_text
    calls = {"n": 0}

    def fails_later(value: Any, null: str) -> str:
        calls["n"] += 1
        if calls["n"] > 5:
            return broken(value, null)
        return original(value, null)

    monkeypatch.setattr(postgresql, "_copy_text", fails_later)
    with pytest.raises(OperationalError):
        CopyProbe.dispatch_many([[i] for i in range(ROWS)])
    assert not Job.objects.exists()
    # The connection is usable afterwards.
    monkeypatch.setattr(postgresql, "_copy_text", original)
    assert len(CopyProbe.dispatch_many([[i] for i in range(ROWS)])) == ROWS


def test_unique_jobs_keep_their_own_insert():
    first = CopyUnique.dispatch_many([[i] for i in range(ROWS)])
    again = CopyUnique.dispatch_many([[i] for i in range(ROWS)])
    assert [j.pk for j in again] == [j.pk for j in first]
    assert Job.objects.filter(queue="copy-unique").count() == ROWS
