"""The job list and a job's page: escaped content, times, errors, search, masked secrets."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_gator import pause_queue
from django_gator.admin import listing
from django_gator.engines.listing import planned_rows
from django_gator.models import FinishedTally, Job, JobState
from tests.admin_helpers import dead_job, dead_jobs, operator
from tests.conftest import SECRET, analyze, run_worker
from tests.factories import JobFactory
from tests.testapp.jobs import FailsFirstTime, Noop

CHANGELIST = "admin:django_gator_job_changelist"


@pytest.mark.django_db
def test_changelist_and_detail_render_with_html_escaped(admin_client: Client):
    job = dead_job()

    listing = admin_client.get(reverse(CHANGELIST))
    detail = admin_client.get(reverse("admin:django_gator_job_change", args=[job.pk]))

    assert listing.status_code == 200
    assert detail.status_code == 200
    body = detail.content.decode()
    assert "&lt;img src=x onerror=alert(1)&gt;" in body
    assert "<img src=x" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "<script>alert(1)</script>" not in body
    assert "<b>bold</b>" not in listing.content.decode()


@pytest.mark.django_db
def test_the_job_list_has_priority_seconds_and_errors_only_where_they_explain_the_state(
    admin_client: Client,
):
    at = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    dead = dead_job(priority=-3, next_execution_at=at, last_error="RuntimeError: dead-marker")
    failed = dead_job(state=JobState.FAILED, last_error="RuntimeError: failed-marker")
    cancelled = dead_job(state=JobState.CANCELLED, last_error="RuntimeError: cancel-marker")
    # Succeeded, waiting or running again after a failed attempt: that error is history.
    succeeded = dead_job(state=JobState.SUCCEEDED, last_error="RuntimeError: old-marker-1")
    waiting = dead_job(state=JobState.WAITING, last_error="RuntimeError: old-marker-2")

    page = admin_client.get(reverse(CHANGELIST)).content.decode()

    assert 'column-priority"' in page
    assert '<td class="field-priority">-3</td>' in page
    assert '<time datetime="2026-03-04T05:06:07+00:00"' in page
    assert '<span class="nowrap">2026-03-04</span> <span class="nowrap">05:06:07</span>' in page
    for marker in ("dead-marker", "failed-marker", "cancel-marker"):
        assert f"RuntimeError: {marker}" in page
    assert "old-marker" not in page
    # The detail pages: times to the second; an old error is not the job's "last error".
    detail = admin_client.get(reverse("admin:django_gator_job_change", args=[dead.pk]))
    assert '<span class="nowrap">05:06:07</span>' in detail.content.decode()
    for job, shown in (
        (
            succeeded,
            "None now (succeeded); the errors of earlier attempts are in the error history.",
        ),
        (waiting, "None now (waiting); the errors of earlier attempts are in the error history."),
        (failed, "RuntimeError: failed-marker"),
        (cancelled, "RuntimeError: cancel-marker"),
    ):
        body = admin_client.get(
            reverse("admin:django_gator_job_change", args=[job.pk])
        ).content.decode()
        field = re.search(
            r'field-last_error_shown">.*?<div class="readonly">(.*?)</div>', body, re.S
        )
        assert field, body
        assert field.group(1) == shown, job.state


@pytest.mark.django_db(transaction=True)
def test_the_changelist_searches_argument_text(admin_client: Client):
    dead_jobs()
    needle = Noop.dispatch("needle-in-args")
    literal = Noop.dispatch("50%_off")
    Noop.dispatch("500 off")
    assert _listed(admin_client, q="needle-in")[0] == {needle.pk}
    # The text is matched literally: % and _ are not wildcards.
    assert _listed(admin_client, q="50%_off")[0] == {literal.pk}


@pytest.mark.django_db(transaction=True)
def test_the_edit_button_shows_only_to_users_who_may_retry():
    groups = dead_jobs()
    job = groups["logins"][0]
    url = reverse("admin:django_gator_job_change", args=[job.pk])
    assert "Edit arguments and retry" not in operator().get(url).content.decode()
    assert "Edit arguments and retry" in operator("retry_job", name="r").get(url).content.decode()


@pytest.mark.django_db(transaction=True)
def test_job_pages_mask_secrets_in_payload_and_errors(admin_client: Client):
    groups = dead_jobs()
    job = next(j for j in groups["logins"] if j.args == ["alice"])
    detail = admin_client.get(reverse("admin:django_gator_job_change", args=[job.pk]))
    listing = admin_client.get(reverse("admin:django_gator_job_changelist"))
    for page in (detail.content.decode(), listing.content.decode()):
        assert SECRET not in page
        assert "pin-8642" not in page
    assert "[redacted]" in detail.content.decode()


@pytest.mark.django_db(transaction=True)
def test_worker_log_lines_mask_secrets(caplog):
    FailsFirstTime.dispatch("dave", password=SECRET)
    with caplog.at_level(logging.INFO):
        run_worker()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "login failed for dave" in text
    assert SECRET not in text


@pytest.mark.django_db
def test_a_long_filtered_list_is_counted_exactly_only_up_to_a_cap(admin_client, monkeypatch):
    from django_gator.admin.jobs import JobAdmin
    from django_gator.admin.listing import EstimatedCountPaginator, planned_rows

    monkeypatch.setattr(EstimatedCountPaginator, "exact_up_to", 5)
    monkeypatch.setattr(JobAdmin, "list_per_page", 2)  # lists longer than their first page
    Noop.dispatch_many([[]] * 12)
    Job.objects.filter(pk__in=list(Job.objects.values_list("pk", flat=True)[:3])).update(
        state=JobState.DEAD
    )

    def counted(query: str) -> int:
        response = admin_client.get(reverse(CHANGELIST) + query)
        assert response.status_code == 200
        return response.context["cl"].result_count

    assert counted("?state__exact=dead") == 3  # under the cap: exact
    waiting = counted("?state__exact=waiting")  # 9 rows, over the cap of 5
    planned = planned_rows(Job.objects.filter(state=JobState.WAITING))
    if connection.vendor == "postgresql":
        assert planned is not None
        assert waiting == max(planned, 6)  # the planner's estimate, never under the cap
    else:
        assert planned is None
        assert waiting == 9  # no estimate here: counted exactly


@pytest.mark.django_db(transaction=True)
def test_a_filtered_list_of_one_page_is_read_once_and_counted_from_it(admin_client):
    """A rare queue among millions of rows has no index to find it: the list reads it once,
    not once to count it and once more to show it."""
    JobFactory.create_batch(3, queue="few")
    JobFactory.create_batch(60, queue="many")
    analyze()
    connection.ensure_connection()

    def job_reads(**query: str) -> tuple[list[str], Any]:
        with CaptureQueriesContext(connection) as captured:
            response = admin_client.get(reverse(CHANGELIST), query)
        assert response.status_code == 200
        sql = [q["sql"].replace("`", '"') for q in captured.captured_queries]
        return [
            s for s in sql if 'WHERE "django_gator_job"."queue" =' in s and "EXPLAIN" not in s
        ], response.context["cl"]

    reads, cl = job_reads(queue="few")
    assert len(reads) == 1, reads
    assert "COUNT(" not in reads[0]
    if connection.vendor == "postgresql":
        # The planner expects few rows: ordered by id + 0, so it reads them by a scan and
        # sorts them instead of walking the primary key from the newest job.
        assert '("django_gator_job"."id" + 0) DESC' in reads[0], reads[0]
    assert cl.result_count == 3
    assert [job.pk for job in cl.result_list] == list(
        Job.objects.filter(queue="few").order_by("-pk").values_list("pk", flat=True)
    )
    # Longer than a page: the first page's read, then the count (capped); not a third read.
    reads, cl = job_reads(queue="many")
    assert len(reads) == 2, reads
    assert cl.result_count == 60
    assert [job.pk for job in cl.result_list] == list(
        Job.objects.filter(queue="many").order_by("-pk").values_list("pk", flat=True)[:50]
    )
    # Another page: counted, then read.
    reads, cl = job_reads(queue="many", p="2")
    assert len(reads) == 2, reads
    assert len(list(cl.result_list)) == 10


def _listed(client: Client, **query: str) -> tuple[set[int], str]:
    response = client.get(reverse(CHANGELIST), query)
    assert response.status_code == 200
    return {job.pk for job in response.context["cl"].result_list}, response.content.decode()


@pytest.mark.django_db(transaction=True)
def test_text_search_of_a_large_list_reads_the_newest_ids_and_offers_to_read_them_all(
    admin_client: Client, monkeypatch
):
    monkeypatch.setattr(listing, "SEARCH_WINDOW", 10)
    old = Noop.dispatch("needle-old")
    Noop.dispatch_many([["hay"]] * 20)
    new = Noop.dispatch("needle-new")
    analyze()

    found, page = _listed(admin_client, q="needle")
    assert found == {new.pk}
    assert f"Searched the newest 10 job ids (from #{new.pk - 9})" in page
    assert 'class="gator-search-all"' in page
    assert "search_all=1" in page

    found, page = _listed(admin_client, q="needle", search_all="1")
    assert found == {old.pk, new.pk}
    assert "gator-search-window" not in page
    # A number finds the job with that id, however old.
    found, _ = _listed(admin_client, q=str(old.pk))
    assert found == {old.pk}
    # A list no larger than the window is read whole.
    monkeypatch.setattr(listing, "SEARCH_WINDOW", 1000)
    found, page = _listed(admin_client, q="needle")
    assert found == {old.pk, new.pk}
    assert "gator-search-window" not in page


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="the planner's estimate")
def test_a_search_within_a_small_filtered_list_reads_all_of_it(admin_client: Client, monkeypatch):
    monkeypatch.setattr(listing, "SEARCH_WINDOW", 10)
    old = JobFactory(dead=True, last_error="RuntimeError: needle")
    Noop.dispatch_many([["hay"]] * 30)
    analyze()
    found, page = _listed(admin_client, q="needle", state__exact="dead")
    assert found == {old.pk}
    assert "gator-search-window" not in page


@pytest.mark.django_db(transaction=True)
@override_settings(GATOR_QUEUES={"q-configured": {"concurrency": 2}})
def test_the_queue_filter_lists_live_dead_paused_finished_and_declared_queues(
    admin_client: Client,
):
    JobFactory(queue="q-wait")
    JobFactory(queue="q-paused")
    pause_queue("q-paused")
    pause_queue("q-empty")
    JobFactory(queue="q-run", running=True)
    JobFactory(queue="q-dead", dead=True)
    JobFactory(queue="q-done", succeeded=True)  # every job of its queue finished
    # ... as its worker counted it (the filter reads the tallies: django_gator.tallies)
    FinishedTally.objects.create(minute=timezone.now(), queue="q-done", succeeded=1)
    # A finished row no worker counted (made by hand) is not read: the rows that ended in
    # the last hour are millions at volume.
    JobFactory(queue="q-untallied", succeeded=True)
    JobFactory(queue="q-cancelled", cancelled=True)
    response = admin_client.get(reverse(CHANGELIST))
    [spec] = [f for f in response.context["cl"].filter_specs if f.title == "queue"]
    choices = [value for value, _ in spec.lookup_choices]
    assert choices == sorted(choices)
    assert {"q-dead", "q-empty", "q-paused", "q-run", "q-wait", "q-done", "q-cancelled"} <= set(
        choices
    )
    assert "q-untallied" not in choices
    assert "q-configured" in choices  # GATOR_QUEUES
    assert "keyed" in choices  # a job class's queue (tests.testapp.jobs.KeyedSpan)
    chosen = admin_client.get(reverse(CHANGELIST), {"queue": "q-nothing-yet"})
    [spec] = [f for f in chosen.context["cl"].filter_specs if f.title == "queue"]
    assert "q-nothing-yet" in [value for value, _ in spec.lookup_choices]


def copy_rows(job: Job, copies: int) -> None:
    """``copies`` more rows like ``job``'s, in one INSERT ... SELECT (bulk_create of 20,000
    built jobs took 20-35 s of Python a test run)."""
    columns = ", ".join(
        connection.ops.quote_name(f.column) for f in Job._meta.concrete_fields if not f.primary_key
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Job._meta.db_table} ({columns}) SELECT {columns} FROM"
            f" {Job._meta.db_table}, generate_series(1, %s) WHERE id = %s",
            [copies, job.pk],
        )


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's estimate")
def test_the_planner_expects_as_many_jobs_of_an_error_class_as_there_are(admin_client: Client):
    """Migration 0030: with the (state, error_class) statistics PostgreSQL no longer takes
    the state and the class for unrelated (it expected 6 of these 300 jobs; at 20,000,000
    rows, 464 of 200,000, and sorted them all for a page of 50)."""
    JobFactory.create_batch(300, dead=True, error_class="ValueError")
    JobFactory.create_batch(100, dead=True, error_class="KeyError")
    copy_rows(JobFactory(succeeded=True), 19_999)  # 20,000 succeeded jobs
    analyze()
    jobs = Job.objects.filter(state__in=(JobState.DEAD, JobState.FAILED), error_class="ValueError")
    assert 150 <= planned_rows(jobs) <= 600
    newest = list(jobs.order_by("-pk").values_list("pk", flat=True)[:50])
    found, _ = _listed(admin_client, error_class="ValueError")
    assert found == set(newest)
