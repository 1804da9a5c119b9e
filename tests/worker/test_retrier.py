"""worker/retrier.py on its own: a write on a connection the server killed is tried again on
a fresh one; a statement the database refuses is raised at once; a worker that is giving
up stops trying and says so (None)."""

from __future__ import annotations

import time

import pytest
from django.db import IntegrityError, OperationalError, connection

from django_gator.models import Job
from django_gator.worker.retrier import Retrier, backoff, drop_connection, refused
from tests.chaos import backend_id, kill_backend
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no connection to kill")
def test_a_write_on_a_killed_connection_is_tried_again_on_a_fresh_one():
    job = JobFactory()
    before = backend_id()
    kill_backend(before)
    retrying = Retrier("default", "w1", lambda until_stop: False)
    tries: list[int] = []

    def write() -> int:
        tries.append(1)
        return Job.objects.filter(pk=job.pk).update(priority=5)

    assert retrying("set a priority", write) == 1
    assert len(tries) >= 2, "the first try met the killed connection"
    assert backend_id() != before, "the retry reconnected"
    assert Job.objects.get(pk=job.pk).priority == 5


def test_a_refused_statement_is_raised_at_once():
    job = JobFactory()
    retrying = Retrier("default", "w1", lambda until_stop: False)
    tries: list[int] = []

    def write() -> None:
        tries.append(1)
        JobFactory(id=job.pk)  # the primary key is taken

    with pytest.raises(IntegrityError):
        retrying("insert a duplicate", write)
    assert tries == [1]
    assert refused(IntegrityError("duplicate"))
    assert not refused(OperationalError("server closed the connection"))


def test_a_worker_giving_up_stops_after_the_second_failure_and_returns_none():
    giving_up = {"now": False}
    retrying = Retrier("default", "w1", lambda until_stop: giving_up["now"])
    tries: list[float] = []

    def fails() -> None:
        tries.append(time.monotonic())
        giving_up["now"] = True  # a forced stop arrives while the database is away
        raise OperationalError("server closed the connection unexpectedly")

    assert retrying("record a success", fails) is None
    assert len(tries) == 2, "one more try after the stop, then it gives up"


def test_until_stop_gives_up_as_soon_as_a_stop_is_asked():
    retrying = Retrier("default", "w1", lambda until_stop: until_stop)
    tries: list[int] = []

    def fails() -> None:
        tries.append(1)
        raise OperationalError("the database system is starting up")

    assert retrying("check the tables", fails, until_stop=True) is None
    assert len(tries) == 1


def test_backoff_doubles_up_to_its_cap_and_drop_connection_leaves_a_transaction_alone():
    assert [backoff(n) for n in (1, 2, 3)] == [0.2, 0.4, 0.8]
    assert backoff(50) == 5.0
    JobFactory()  # opens the connection
    from django.db import transaction

    with transaction.atomic():
        Job.objects.count()
        drop_connection("default")
        assert connection.connection is not None, "an open transaction is not cut"
    drop_connection("default")
    assert connection.connection is None
