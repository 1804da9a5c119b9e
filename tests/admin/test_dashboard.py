"""The job dashboard: queues, throughput, workers, unserved queues."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from tests.admin_helpers import dead_jobs
from tests.testapp.jobs import Noop

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_dashboard_shows_queues_throughput_and_workers(admin_client: Client):
    dead_jobs()
    Noop.dispatch()
    Noop.dispatch(wait=3600)
    page = admin_client.get(reverse("admin:django_gator_job_dashboard")).content.decode()
    assert 'id="gator-queues"' in page
    assert "<svg" in page
    assert "Last hour: 0 succeeded, 5 dead" in page
    assert "No live worker." in page
    assert "<script" not in page.split('id="content-main"')[1].split("</svg>")[0]


def test_the_dashboard_says_when_the_row_count_is_an_estimate(admin_client: Client):
    from django_gator.stats import estimated_total

    Noop.dispatch()
    total, exact = estimated_total()
    page = admin_client.get(reverse("admin:django_gator_job_dashboard")).content.decode()
    assert ("About" in page) is (not exact)
    assert f"{total} job rows" in page


def test_the_dashboard_flags_a_queue_with_due_jobs_that_no_live_worker_serves(
    admin_client: Client,
):
    from tests.factories import JobFactory, WorkerFactory
    from tests.testapp.jobs import Echo

    Noop.dispatch()  # due now on "default"
    Echo.dispatch()  # due now on "echo"
    Noop.dispatch(queue="later", wait=3600)  # nothing due there yet
    WorkerFactory(queues=[["echo", 3]])  # live, serves echo only
    WorkerFactory(stale=True, queues=[])  # would serve every queue, but its heartbeat lapsed
    url = reverse("admin:django_gator_job_dashboard")

    def flagged() -> list[str]:
        page = admin_client.get(url).content.decode()
        rows = re.findall(r'<tr class="gator-unserved">\s*<td><a href="[^"]*">([^<]*)</a>', page)
        note = re.search(r'<p class="errornote gator-unserved-note">(.*?)</p>', page, re.S)
        assert bool(rows) == bool(note), page
        if note:
            assert "no live worker" in note.group(1)
            for queue in rows:
                assert f"<code>{queue}</code>" in note.group(1)
        return rows

    assert flagged() == ["default"]
    WorkerFactory(queues=[["default", 1], ["other", 2]])
    assert flagged() == []
    JobFactory(name=Echo.name, queue="<b>x</b>")  # dispatch() refuses the name; a row can hold it
    assert flagged() == ["&lt;b&gt;x&lt;/b&gt;"]
    WorkerFactory(queues=[])  # a worker started without -q serves every queue
    assert flagged() == []


def test_the_dashboard_chart_has_its_legend_and_axes(admin_client: Client):
    dead_jobs()
    page = admin_client.get(reverse("admin:django_gator_job_dashboard")).content.decode()
    svg = page.split('<svg xmlns="http://www.w3.org/2000/svg"')[1].split("</svg>")[0]
    assert 'class="gator-legend"' in svg
    assert "time (UTC)" in svg
    assert len(re.findall(r'<g class="gator-x-axis".*?</g>', svg, re.S)) == 1
