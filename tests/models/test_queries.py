"""The domain verbs of the Job queryset that the commands (and the admin) call:
``raised()``, ``finished()`` and ``prune()``."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_gator.models import Job, JobState, Pruned
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


def raised_by(error_class: str | None, last_error: str = "", **fields: Any) -> Job:
    """A dead job with ``error_class`` (None: a row from before migration 0005)."""
    job = JobFactory(dead=True, **fields)
    Job.objects.filter(pk=job.pk).update(error_class=error_class, last_error=last_error)
    return job


def ids(jobs: Any) -> set[int]:
    return set(jobs.values_list("pk", flat=True))


# -- raised() -----------------------------------------------------------------------------


def test_raised_matches_the_recorded_class_or_its_last_dotted_parts():
    boom = raised_by("myapp.jobs.Boom", "myapp.jobs.Boom: no")
    builtin = raised_by("ValueError", "ValueError: bad")
    longer = raised_by("myapp.jobs.Boomer", "myapp.jobs.Boomer: no")
    prefixed = raised_by("myapp.jobs.BigBoom", "myapp.jobs.BigBoom: no")

    assert ids(Job.objects.raised("Boom")) == {boom.pk}
    assert ids(Job.objects.raised("jobs.Boom")) == {boom.pk}
    assert ids(Job.objects.raised("myapp.jobs.Boom")) == {boom.pk}
    assert ids(Job.objects.raised("pp.jobs.Boom")) == set()  # parts, not characters
    assert ids(Job.objects.raised("Boom", "ValueError")) == {boom.pk, builtin.pk}
    assert ids(Job.objects.raised("BigBoom")) == {prefixed.pk}
    assert ids(Job.objects.raised("Boomer")) == {longer.pk}


def test_raised_is_case_sensitive_and_takes_dots_literally():
    boom = raised_by("myapp.jobs.Boom", "myapp.jobs.Boom: no")
    raised_by("myapp.jobsXBoom", "myapp.jobsXBoom: no")

    assert ids(Job.objects.raised("boom")) == set()
    assert ids(Job.objects.raised("jobs.Boom")) == {boom.pk}
    assert ids(Job.objects.raised("jobs.boom", "JOBS.BOOM")) == set()


def test_raised_reads_last_error_only_for_rows_without_an_error_class():
    # Migration 0005 added error_class without filling it: older rows name their class at
    # the start of last_error ("Class: message", or "Class" alone).
    old = raised_by(None, "myapp.jobs.Boom: card expired")
    bare = raised_by(None, "myapp.jobs.Boom")
    mentioned = raised_by(None, "ValueError: see myapp.jobs.Boom: here")
    recorded = raised_by("KeyError", "myapp.jobs.Boom: the column wins")
    raised_by(None, "")

    assert ids(Job.objects.raised("Boom")) == {old.pk, bare.pk}
    assert ids(Job.objects.raised("ValueError")) == {mentioned.pk}
    assert ids(Job.objects.raised("KeyError")) == {recorded.pk}


def test_raised_exact_matches_one_recorded_class_as_the_admins_groups_do():
    builtin = raised_by("ValueError", "ValueError: bad")
    mine = raised_by("myapp.ValueError", "myapp.ValueError: also bad")
    old = raised_by(None, "ValueError: from before 0005")
    old_mine = raised_by(None, "myapp.ValueError: also from before")

    assert ids(Job.objects.raised("ValueError", exact=True)) == {builtin.pk, old.pk}
    assert ids(Job.objects.raised("myapp.ValueError", exact=True)) == {mine.pk, old_mine.pk}
    assert len(ids(Job.objects.raised("ValueError"))) == 4  # loosely: every ValueError


def test_raised_composes_with_the_other_verbs():
    dead = raised_by("ValueError", "ValueError: x")
    failed = JobFactory(failed=True)
    Job.objects.filter(pk=failed.pk).update(error_class="ValueError")

    assert ids(Job.objects.dead().raised("ValueError")) == {dead.pk}
    assert ids(Job.objects.raised("ValueError")) == {dead.pk, failed.pk}
    assert ids(Job.objects.raised()) == set()


@pytest.mark.parametrize("bad", ["", "Runtime Error", "a:b", 7])
def test_raised_refuses_what_cannot_be_a_class_naming_it(bad):
    with pytest.raises(ValueError, match="is not an exception class name") as caught:
        Job.objects.raised("ValueError", bad)

    assert repr(bad) in str(caught.value)


# -- finished() and prune() ---------------------------------------------------------------


def jobs_of_every_state(finished_at: Any) -> dict[str, Job]:
    """One job per state, each with ``finished_at`` (even those that have not finished)."""
    made = {
        "waiting": JobFactory(),
        "running": JobFactory(running=True),
        "failed": JobFactory(failed=True),
        "succeeded": JobFactory(succeeded=True),
        "dead": JobFactory(dead=True),
        "cancelled": JobFactory(cancelled=True),
    }
    Job.objects.update(finished_at=finished_at)
    return made


def test_finished_is_the_final_states_and_before_is_strict():
    now = timezone.now()
    jobs = jobs_of_every_state(now - DAY)
    final = {jobs[state].pk for state in ("succeeded", "dead", "cancelled")}

    assert ids(Job.objects.finished()) == final
    assert ids(Job.objects.finished(before=now)) == final
    assert ids(Job.objects.finished(before=now - DAY)) == set()
    assert ids(Job.objects.filter(state=JobState.DEAD).finished(before=now)) == {jobs["dead"].pk}


def test_prune_never_deletes_an_unfinished_job():
    jobs = jobs_of_every_state(timezone.now() - 100 * DAY)

    pruned = Job.objects.all().prune()

    assert pruned == Pruned(deleted=3, batches=1, stopped=False)
    assert ids(Job.objects.all()) == {jobs[s].pk for s in ("waiting", "running", "failed")}


def test_prune_goes_oldest_first_in_batches_and_reports_each():
    now = timezone.now()
    old = [JobFactory(succeeded=True, finished_at=now - n * DAY) for n in range(5, 0, -1)]
    seen: list[int] = []

    pruned = Job.objects.all().prune(batch_size=2, max_batches=2, progress=seen.append)

    assert pruned == Pruned(deleted=4, batches=2, stopped=True)
    assert seen == [2, 2]
    assert ids(Job.objects.all()) == {old[-1].pk}  # the newest is left

    assert Job.objects.all().prune(batch_size=2) == Pruned(deleted=1, batches=1, stopped=False)
    assert Job.objects.all().prune(batch_size=2) == Pruned(deleted=0, batches=0, stopped=False)


def test_prune_with_no_batches_left_deletes_nothing_and_says_it_stopped():
    JobFactory(succeeded=True)

    assert Job.objects.all().prune(max_batches=0) == Pruned(deleted=0, batches=0, stopped=True)
    assert Job.objects.count() == 1


@pytest.fixture
def small_parameter_limit() -> Iterator[None]:
    """SQLite under Django 6 reports SQLite's own limit of parameters per statement
    (32,766 or more, where Django 5.2 says 999): lower it for the connection, as a
    deployment may, so that a batch over it stays small."""
    if connection.vendor != "sqlite":
        yield
        return
    connection.ensure_connection()
    raw = connection.connection
    before = raw.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
    connection.features.__dict__.pop("max_query_params", None)
    try:
        yield
    finally:
        raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, before)
        connection.features.__dict__.pop("max_query_params", None)


@pytest.mark.usefixtures("small_parameter_limit")
def test_prune_a_batch_over_the_databases_parameter_limit():
    limit = connection.features.max_query_params or 999
    assert limit <= 65535, limit
    now = timezone.now()
    Job.objects.bulk_create(
        Job(name="tests.testapp.jobs.Noop", state=JobState.SUCCEEDED, finished_at=now)
        for _ in range(limit + 5)
    )

    pruned = Job.objects.all().prune(batch_size=limit + 10)

    assert pruned == Pruned(deleted=limit + 5, batches=1, stopped=False)
    assert not Job.objects.exists()


def test_prune_refuses_an_empty_batch_naming_it():
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        Job.objects.all().prune(batch_size=0)
