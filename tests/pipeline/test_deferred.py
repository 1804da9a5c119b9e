"""dispatch(..., on_commit=True) when the jobs database is away at commit: the caller's
transaction and its other commit callbacks go on, the INSERT is tried again, and a job that
cannot be inserted is logged (secrets masked) and signalled, never silently lost.

The jobs table lives behind a second alias, ``jobs``: its own connection to the test
database, which a test cuts off for real (the server kills its session and the alias points
at a port that refuses connections; on SQLite, at a file in a directory that does not
exist) while the caller's transaction runs on ``default``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import OperationalError, connection, connections, transaction

from django_gator import Chain, Queueable, Workflow, encryption
from django_gator.models import Job, WorkflowRun
from django_gator.signals import dispatch_failed, job_dispatched
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "jobs"])

JOBS = "jobs"


class Invoice(Queueable):
    queue = "billing"
    priority = 3

    def handle(self, *args: Any, **kwargs: Any) -> None:
        return None


class SecretInvoice(Queueable):
    encrypted = True
    queue = "billing"

    def handle(self, *args: Any, **kwargs: Any) -> None:
        return None


class UniqueInvoice(Queueable):
    unique = True
    queue = "billing"

    def handle(self, number: int) -> None:
        return None


class JobsDatabase:
    """The ``jobs`` alias, and a way to take its database away and give it back."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.settings = connections.settings[JOBS]  # the dict its connections read
        self.original = copy.deepcopy(self.settings)
        self.refuser: socket.socket | None = None

    def down(self) -> None:
        """Kill the open connection's session on the server (close it, on SQLite) and point
        the alias where no database answers."""
        jobs = connections[JOBS]
        if connection.vendor == "sqlite":
            jobs.close()
            self.settings["NAME"] = str(self.tmp_path / "no-such-directory" / "jobs.sqlite3")
            return
        with jobs.cursor() as cursor:
            cursor.execute(
                {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}[
                    jobs.vendor
                ]
            )
            [pid] = cursor.fetchone()
        with connections["default"].cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
                assert cursor.fetchone()[0] is True
            else:
                cursor.execute(f"KILL CONNECTION {int(pid)}")
        # A bound socket that does not listen: connecting to it is refused at once.
        self.refuser = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.refuser.bind(("127.0.0.1", 0))
        self.settings["HOST"] = "127.0.0.1"
        self.settings["PORT"] = str(self.refuser.getsockname()[1])

    def up(self) -> None:
        self.settings.clear()
        self.settings.update(copy.deepcopy(self.original))

    def close(self) -> None:
        self.up()
        if self.refuser is not None:
            self.refuser.close()


@pytest.fixture(scope="module", autouse=True)
def jobs_alias(django_db_setup: None) -> Iterator[None]:
    """A second alias, "jobs", with its own connections to the test database (added after
    the test databases exist, so that it points at them; tests name it in ``databases``)."""
    connections.settings[JOBS] = copy.deepcopy(connections["default"].settings_dict)
    yield
    connections.close_all()
    with contextlib.suppress(AttributeError):
        del connections[JOBS]
    del connections.settings[JOBS]


@pytest.fixture
def jobs_db(settings: Any, tmp_path: Path) -> Iterator[JobsDatabase]:
    """GATOR_DATABASE = "jobs", with a live connection that down() cuts off."""
    settings.GATOR_DATABASE = JOBS
    settings.GATOR_DISPATCH_ON_COMMIT_RETRY_DELAYS = [0.05, 0.1, 0.2]
    database = JobsDatabase(tmp_path)
    try:
        assert not Job.objects.using(JOBS).exists()  # opens the connection
        yield database
    finally:
        database.close()
        connections[JOBS].close()


@pytest.fixture
def failures() -> Iterator[list[dict[str, Any]]]:
    """What dispatch_failed sent."""
    sent: list[dict[str, Any]] = []

    def receiver(sender: type, **kwargs: Any) -> None:
        sent.append({"sender": sender, **kwargs})

    dispatch_failed.connect(receiver)
    yield sent
    dispatch_failed.disconnect(receiver)


def records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "django_gator.dispatch" and r.levelno == level
    ]


def test_a_job_that_cannot_be_inserted_at_commit_is_logged_and_signalled(jobs_db, failures, caplog):
    later: list[str] = []
    started = time.monotonic()
    with transaction.atomic():
        Execution.objects.create(job_id=1, attempt=1, pid=1, label="the caller's data")
        job = Invoice.dispatch(
            "INV-7", 42.5, password="hunter2-very-secret", note="two\nlines", on_commit=True
        )
        other = Invoice.dispatch("INV-8", on_commit=True, queue="billing-eu", wait=3600)
        transaction.on_commit(lambda: later.append("the caller's next callback"))
        jobs_db.down()
    elapsed = time.monotonic() - started

    # The caller's transaction committed, its later callback ran, nothing was raised.
    assert Execution.objects.filter(label="the caller's data").exists()
    assert later == ["the caller's next callback"]
    assert (job.pk, other.pk) == (None, None)
    assert elapsed < 15  # three short retries per dispatch, not a hang

    # Tried again after each delay, then logged: one line per job, enough to re-create it.
    assert len(records(caplog, logging.WARNING)) == 6
    lost = records(caplog, logging.ERROR)
    assert len(lost) == 2, lost
    first, second = lost
    assert first.startswith("Deferred dispatch lost: job not inserted ")
    fields = dict(re.findall(r"(\w+)=(\S+)", first.split(" error=")[0]))
    assert fields["name"] == "tests.pipeline.test_deferred.Invoice"
    assert (fields["queue"], fields["priority"], fields["run_at"]) == ("billing", "3", "now")
    assert fields["tries"] == "4"
    assert json.loads(fields["args"]) == ["INV-7", 42.5]
    assert json.loads(fields["kwargs"]) == {"password": "[redacted]", "note": "two\nlines"}
    assert "hunter2" not in first
    assert "\n" not in first  # the newline in the argument is escaped
    assert "error=OperationalError: " in first
    assert "queue=billing-eu" in second
    assert re.search(r"run_at=\d{4}-\d\d-\d\dT", second)  # the time it was due

    # And the signal, once per dispatch, with the unsaved jobs and the last error.
    assert [f["sender"] for f in failures] == [Invoice, Invoice]
    assert failures[0]["jobs"] == [job]
    assert failures[0]["jobs"][0].kwargs["password"] == "hunter2-very-secret"
    assert isinstance(failures[0]["exception"], OperationalError)

    jobs_db.up()
    assert not Job.objects.using(JOBS).exists()


def test_a_lost_encrypted_job_is_logged_sealed(jobs_db, failures, caplog):
    with transaction.atomic():
        SecretInvoice.dispatch("INV-9", iban="DE02120300000000202051", on_commit=True)
        jobs_db.down()

    [lost] = records(caplog, logging.ERROR)
    assert "DE0212" not in lost
    assert "INV-9" not in lost
    fields = dict(re.findall(r"(\w+)=(\S+)", lost.split(" error=")[0]))
    args, kwargs = json.loads(fields["args"]), json.loads(fields["kwargs"])
    # The envelopes: whoever holds the key can dispatch the job again from them.
    assert encryption.open_value(args, "args") == ["INV-9"]
    assert encryption.open_value(kwargs, "kwargs") == {"iban": "DE02120300000000202051"}
    assert [f["sender"] for f in failures] == [SecretInvoice]
    jobs_db.up()


def test_a_jobs_database_back_within_the_retries_gets_the_job(jobs_db, failures, caplog):
    class BringBack(logging.Handler):
        """Brings the database back when dispatch says it will try again."""

        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("Deferred dispatch failed; retrying"):
                jobs_db.up()

    dispatched: list[Any] = []

    def on_dispatched(sender: type, jobs: list[Job], **kwargs: Any) -> None:
        dispatched.extend(jobs)

    handler = BringBack()
    logging.getLogger("django_gator.dispatch").addHandler(handler)
    job_dispatched.connect(on_dispatched)
    later: list[str] = []
    try:
        with transaction.atomic():
            job = Invoice.dispatch("INV-9", on_commit=True)
            unique = UniqueInvoice.dispatch(9, on_commit=True)
            transaction.on_commit(lambda: later.append("next"))
            jobs_db.down()
    finally:
        logging.getLogger("django_gator.dispatch").removeHandler(handler)
        job_dispatched.disconnect(on_dispatched)

    assert later == ["next"]
    assert job.pk is not None
    assert unique.pk is not None
    rows = {row.pk: row for row in Job.objects.using(JOBS).all()}
    assert rows[job.pk].args == ["INV-9"]
    assert rows[unique.pk].args == [9]
    assert len(rows) == 2
    assert dispatched == [job, unique]
    assert len(records(caplog, logging.WARNING)) == 1  # the first try; the second worked
    assert records(caplog, logging.ERROR) == []
    assert failures == []


def test_a_bad_retry_setting_fails_the_dispatch_itself(jobs_db, settings):
    for bad in ["fast", [1, "x"], [-1], [1000], None]:
        settings.GATOR_DISPATCH_ON_COMMIT_RETRY_DELAYS = bad
        with (
            pytest.raises(ImproperlyConfigured, match="GATOR_DISPATCH_ON_COMMIT_RETRY_DELAYS"),
            transaction.atomic(),
        ):
            Invoice.dispatch("x", on_commit=True)
    settings.GATOR_DISPATCH_ON_COMMIT_RETRY_DELAYS = []
    with transaction.atomic():
        job = Invoice.dispatch("no retries", on_commit=True)
    assert Job.objects.using(JOBS).get(pk=job.pk).args == ["no retries"]


def test_a_workflow_that_cannot_be_inserted_at_commit_is_logged_and_signalled(
    jobs_db, failures, caplog
):
    # As a plain job's deferred INSERT: retried, then logged and signalled; the caller's
    # transaction and its later callbacks go on.
    later: list[str] = []
    workflow = Workflow("billing run")
    first = workflow.add(Invoice, "INV-10", password="hunter2-very-secret")
    workflow.add(UniqueInvoice, 10, after=[first])
    with transaction.atomic():
        Execution.objects.create(job_id=1, attempt=1, pid=1, label="the caller's data")
        run = workflow.dispatch(on_commit=True)
        transaction.on_commit(lambda: later.append("the caller's next callback"))
        jobs_db.down()

    assert Execution.objects.filter(label="the caller's data").exists()
    assert later == ["the caller's next callback"]
    assert first.job is not None
    assert first.job.pk is None
    assert len(records(caplog, logging.WARNING)) == 3  # one per retry delay
    lost = records(caplog, logging.ERROR)
    assert len(lost) == 1, lost
    assert lost[0].startswith("Deferred dispatch lost: workflow not inserted ")
    assert f"id={run.id}" in lost[0]
    assert "name=billing run" not in lost[0]  # quoted safely: the name has a space
    steps = json.loads(re.search(r" steps=(\S+)", lost[0]).group(1))
    assert [step["name"] for step in steps] == [Invoice.name, UniqueInvoice.name]
    assert steps[0]["kwargs"] == {"password": "[redacted]"}
    assert (steps[1]["args"], steps[1]["after"]) == ([10], [0])
    assert "hunter2" not in lost[0]
    assert [f["sender"] for f in failures] == [Invoice]
    assert failures[0]["jobs"] == [first.job]
    assert isinstance(failures[0]["exception"], OperationalError)
    jobs_db.up()
    assert not Job.objects.using(JOBS).exists()
    assert not WorkflowRun.objects.using(JOBS).exists()


def test_a_workflow_whose_database_is_back_within_the_retries_is_inserted(jobs_db, caplog):
    class BringBack(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("Deferred dispatch failed; retrying"):
                jobs_db.up()

    handler = BringBack()
    logging.getLogger("django_gator.dispatch").addHandler(handler)
    try:
        with transaction.atomic():
            first = Chain(Invoice, Invoice).dispatch("INV-11", on_commit=True)
            jobs_db.down()
    finally:
        logging.getLogger("django_gator.dispatch").removeHandler(handler)
    assert first.pk is not None
    row = Job.objects.using(JOBS).get(pk=first.pk)
    assert (row.args, row.chain_position) == (["INV-11"], 0)
    assert WorkflowRun.objects.using(JOBS).filter(pk=first.chain_id).exists()
    assert len(records(caplog, logging.WARNING)) == 1
    assert records(caplog, logging.ERROR) == []
