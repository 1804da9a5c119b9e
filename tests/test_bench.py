"""gator_bench runs end to end on every database and cleans up after itself."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from django_gator.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def test_gator_bench_reports_every_measurement_and_leaves_no_rows():
    out = StringIO()

    call_command(
        "gator_bench",
        "--dispatch=5",
        "--dispatch-many=30",
        "--batch=10",
        "--drain=40",
        "--concurrency=2",
        "--latency=3",
        stdout=out,
    )

    text = out.getvalue()
    for label in (
        "dispatch, one at a time",
        "dispatch_many",
        "drain 40 no-op jobs",
        "p50",
        "Task.enqueue()",
        "drain 40 no-op @task calls",
    ):
        assert label in text, text
    assert "jobs/s (RSS" in text
    assert not Job.objects.filter(queue="gator-bench").exists()
