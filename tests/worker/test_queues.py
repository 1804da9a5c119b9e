"""Weighted queues: the order a worker tries its queues in, and what it does with it."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from django_gator.models import Job, JobState
from django_gator.worker.queues import QueueSpec, parse_queue_spec, weighted_order
from tests.conftest import run_worker
from tests.testapp.jobs import Record
from tests.testapp.models import Execution


def test_first_pick_follows_the_weights():
    rng = random.Random(1234)
    specs = [QueueSpec("critical", 3), QueueSpec("default", 1)]

    firsts = Counter(weighted_order(specs, rng)[0] for _ in range(20_000))

    ratio = firsts["critical"] / firsts["default"]
    assert 2.8 < ratio < 3.2


def test_three_weights_share_the_first_pick_in_proportion():
    rng = random.Random(99)
    specs = [QueueSpec("a", 6), QueueSpec("b", 3), QueueSpec("c", 1)]

    firsts = Counter(weighted_order(specs, rng)[0] for _ in range(30_000))

    # Efraimidis-Spirakis with one item: P(first) = w / sum(w).
    for name, weight in (("a", 6), ("b", 3), ("c", 1)):
        assert firsts[name] / 30_000 == pytest.approx(weight / 10, abs=0.015)


def test_every_queue_is_in_every_order():
    rng = random.Random(7)
    specs = [QueueSpec("a", 1000), QueueSpec("b", 1), QueueSpec("c", 1)]
    for _ in range(1000):
        assert sorted(weighted_order(specs, rng)) == ["a", "b", "c"]


def test_equal_weights_are_shuffled_evenly():
    rng = random.Random(3)
    specs = [QueueSpec(n) for n in "abcd"]

    firsts = Counter(weighted_order(specs, rng)[0] for _ in range(8000))

    assert all(1800 < firsts[n] < 2200 for n in "abcd")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("low", QueueSpec("low", 1)), ("critical,8", QueueSpec("critical", 8))],
)
def test_queue_specs_parse(text, expected):
    assert parse_queue_spec(text) == expected


@pytest.mark.django_db(transaction=True)
def test_a_worker_serves_busy_queues_in_weight_proportion():
    Record.dispatch_many([["heavy"]] * 300, queue="heavy")
    Record.dispatch_many([["light"]] * 300, queue="light")

    run_worker("heavy,3", "light,1", concurrency=1, rng=random.Random(42))

    # While both queues had work (the first 200 runs), heavy got about three in four.
    first = list(Execution.objects.order_by("id").values_list("label", flat=True)[:200])
    assert 125 <= first.count("heavy") <= 175
    assert Job.objects.exclude(state=JobState.SUCCEEDED).count() == 0


@pytest.mark.django_db(transaction=True)
def test_an_empty_heavy_queue_never_idles_the_worker():
    jobs = Record.dispatch_many([["light"]] * 50, queue="light")

    worker = run_worker("empty,100", "light,1", concurrency=2)

    assert worker.processed == 50
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], state=JobState.SUCCEEDED).count() == 50
