"""The limits job classes declare (``concurrency_limit``, ``rate_limit``, per key or for
the class) shown beside their queue in the dashboard, ``gator_status`` and ``gator_queue``,
where the queue's limit read "none"."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from django_gator import stats
from tests.testapp.jobs import KeyedSpan, RatedSpan

pytestmark = pytest.mark.django_db(transaction=True)

KEYED = "KeyedSpan 2 at once per key; OneAtATime 1 at once; sync_user 1 at once per key"


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_the_queue_figures_carry_their_job_classes_limits():
    KeyedSpan.dispatch("p", "a", 0)
    RatedSpan.dispatch("p", "a", 0)

    by_queue = {q.queue: q for q in stats.queue_stats()}

    assert by_queue["keyed"].limit_text == ""  # no limit of the queue's own
    assert by_queue["keyed"].job_limit_text == KEYED
    assert by_queue["rated"].limits_text == "RatedSpan 5/s per key"
    [rated] = by_queue["rated"].job_limits
    assert (rated.job, rated.concurrency_limit, rated.rate_limit, rated.per_key) == (
        RatedSpan.name,
        None,
        "5/s",
        True,
    )


def test_gator_queue_and_gator_status_show_them():
    KeyedSpan.dispatch("p", "a", 0)

    [keyed_line] = [line for line in run("gator_queue", "list").splitlines() if "keyed" in line]
    assert keyed_line.endswith(KEYED)
    assert "none" not in keyed_line
    [document] = [
        q for q in json.loads(run("gator_queue", "list", "--json")) if q["queue"] == "keyed"
    ]
    assert document["job_limits"][0] == {
        "job": KeyedSpan.name,
        "concurrency_limit": 2,
        "rate_limit": "",
        "per_key": True,
    }
    assert any(line.endswith(KEYED) for line in run("gator_status").splitlines())


def test_the_dashboard_shows_them_instead_of_none(admin_client: Client):
    KeyedSpan.dispatch("p", "a", 0)

    page = admin_client.get(reverse("admin:django_gator_job_dashboard")).content.decode()

    row = page.split('<td class="gator-limit">')[1].split("</td>")[0]  # "keyed" sorts first
    assert f'title="{KeyedSpan.name}">KeyedSpan 2 at once per key</span>' in row
    assert "none" not in row
