"""The worker list."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_workers_page_shows_queues_and_weights_readably(admin_client: Client):
    from tests.factories import WorkerFactory

    weighted = WorkerFactory(queues=[["critical", 8], ["default", 1], ["<b>x</b>", 2]])
    every = WorkerFactory(queues=[])
    listing = admin_client.get(reverse("admin:django_gator_worker_changelist")).content.decode()
    detail = admin_client.get(
        reverse("admin:django_gator_worker_change", args=[weighted.pk])
    ).content.decode()
    readable = "critical (weight 8), default (weight 1), &lt;b&gt;x&lt;/b&gt; (weight 2)"
    for page in (listing, detail):
        assert readable in page
        assert "[[" not in page
        assert "&quot;critical&quot;" not in page
        assert "<b>x</b>" not in page
    assert "all queues" in listing
    assert (
        "all queues"
        in admin_client.get(
            reverse("admin:django_gator_worker_change", args=[every.pk])
        ).content.decode()
    )
    # Times to the second, as on the job pages.
    assert f'<span class="nowrap">{every.heartbeat_at:%H:%M:%S}</span>' in listing


def test_the_workers_page_shows_each_process_with_its_supervisor(admin_client: Client):
    from tests.factories import WorkerFactory

    sup = "host-a:4242:0badcafe"
    children = [WorkerFactory(supervisor=sup) for _ in range(2)]
    alone = WorkerFactory()

    listing = admin_client.get(reverse("admin:django_gator_worker_changelist")).content.decode()
    narrowed = admin_client.get(
        reverse("admin:django_gator_worker_changelist"), {"supervisor": sup}
    ).content.decode()

    assert listing.count(sup) >= 2
    assert all(child.id in narrowed for child in children)
    assert alone.id not in narrowed
    # Workers started on their own first, then each supervisor's processes together.
    assert listing.index(alone.id) < min(listing.index(child.id) for child in children)
