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


def test_gator_bench_compares_a_batch_step_with_a_batch_and_leaves_no_rows():
    from django_gator.models import Batch, WorkflowRun

    out = StringIO()
    call_command(
        "gator_bench",
        "--only=batch_step",
        "--batch=20",
        "--rounds=3",
        "--drain=30",
        "--concurrency=2",
        stdout=out,
    )

    text = out.getvalue()
    assert text.count("20 jobs: in a Batch / as a batch step") == 3, text
    assert "batch step / Batch, median" in text
    # Draining the members of each (every one of them checked succeeded by bench_drain).
    assert text.count("drain 30: Batch / batch step") == 1, text
    assert "drain, batch step / Batch, median" in text
    assert not Job.objects.exists()
    assert not Batch.objects.exists()
    assert not WorkflowRun.objects.exists()
