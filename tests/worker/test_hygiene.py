"""worker/hygiene.py on its own: after a job, a transaction it left open is rolled back and
reported, a session it changed is closed, and a connection it never used is not asked."""

from __future__ import annotations

import pytest
from django.db import connection

from django_gator.models import Job
from django_gator.worker.hygiene import ConnectionWatch
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _begin() -> str:
    return "START TRANSACTION" if connection.vendor == "mysql" else "BEGIN"


def test_a_transaction_left_open_is_rolled_back_reported_and_its_connection_closed():
    job = JobFactory(priority=0)
    with ConnectionWatch() as watch:
        with connection.cursor() as cursor:
            cursor.execute(_begin())
        Job.objects.filter(pk=job.pk).update(priority=7)  # joins the stray transaction
    problems = watch.clean()
    assert problems == ["a transaction left open on the database 'default'"]
    assert connection.connection is None, "the connection is closed: the next job reconnects"
    assert Job.objects.get(pk=job.pk).priority == 0, "the uncommitted write is gone"


def test_a_changed_session_is_closed_without_a_problem():
    JobFactory()
    statement = {
        "postgresql": "SET statement_timeout = 1234",
        "mysql": "SET SESSION sql_mode = 'ANSI'",
        "sqlite": "PRAGMA cache_size = 123",
    }[connection.vendor]
    with ConnectionWatch() as watch, connection.cursor() as cursor:
        cursor.execute(statement)
    assert watch.clean() == []
    assert connection.connection is None, "no setting outlives the job that made it"


def test_a_clean_job_keeps_its_connection_and_one_without_queries_is_not_asked():
    JobFactory()
    opened = connection.connection
    with ConnectionWatch() as watch:
        assert Job.objects.count() == 1
    assert watch.used()
    assert watch.clean() == []
    assert connection.connection is opened

    with ConnectionWatch() as idle:
        pass
    assert not idle.used()
    assert idle.clean() == []


def test_a_connection_a_job_opens_is_kept_although_its_setup_changed_the_session():
    # MariaDB's connect runs SET SQL_AUTO_IS_NULL = 0 through Django's cursor: that was taken
    # for the job's own session change, so every job that connected had its connection
    # closed after it, and the next job connected again.
    JobFactory()
    connection.close()
    with ConnectionWatch() as watch:
        assert Job.objects.count() == 1  # connects first
    assert watch.clean() == []
    assert connection.connection is not None, "the new connection is kept for the next job"
