"""Flow control with real worker processes (3 processes x 8 threads): a ledger of each job's
start and end (a file every job appends one line to) proves that no queue or key limit was
exceeded, no rate window started more than its rate, and other keys and queues kept flowing;
a SIGKILLed worker's slots come back when its jobs are rescued."""

from __future__ import annotations

import signal
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import pytest

from django_gator.models import Job, JobState, Queue
from tests.conftest import stop_worker, wait_for
from tests.testapp.jobs import KeyedSpan, RatedSpan, Span

pytestmark = pytest.mark.django_db(transaction=True)

PROCESSES, THREADS = 3, 8


def read_ledger(path: Path) -> list[tuple[int, str, float, float]]:
    spans = []
    for line in path.read_text().splitlines():
        job_id, key, start, end, _pid = line.split()
        spans.append((int(job_id), key, float(start), float(end)))
    return spans


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most intervals open at once (an end at the same instant as a start closes first)."""
    events = sorted([(end, -1) for _, end in spans] + [(start, 1) for start, _ in spans])
    most = running = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def test_limits_hold_across_worker_processes_and_nothing_blocks(spawn_worker, tmp_path):
    ledger = tmp_path / "ledger.txt"
    path = str(ledger)
    # The queue's limit is a row an operator set: no restart, no setting.
    Queue.objects.set_limits("spans", concurrency=3, rate_limit=None, by="test")
    spans = Span.dispatch_many([[path, "q", 0.05]] * 30)
    # One key with a backlog of 40 jobs, queued ahead of six other keys' jobs.
    busy = KeyedSpan.dispatch_many([[path, "busy", 0.05]] * 40, priority=5)
    keyed = KeyedSpan.dispatch_many([[path, str(i % 6), 0.05] for i in range(24)])
    rated = RatedSpan.dispatch_many([[path, f"r{i % 2}", 0] for i in range(24)])
    free = Span.dispatch_many([[path, "free", 0.02]] * 40, queue="free")
    every = [*spans, *busy, *keyed, *rated, *free]

    workers = [spawn_worker("--concurrency", str(THREADS)) for _ in range(PROCESSES)]
    wait_for(lambda: Job.objects.filter(state=JobState.SUCCEEDED).count() == len(every), timeout=90)
    for proc in workers:
        stop_worker(proc)

    rows = {row.pk: row for row in Job.objects.all()}
    assert {rows[j.pk].state for j in every} == {JobState.SUCCEEDED}
    assert {rows[j.pk].attempts for j in every} == {1}  # nobody was charged for waiting
    spans_by_id = {s[0]: s for s in read_ledger(ledger)}
    assert sorted(spans_by_id) == sorted(j.pk for j in every)

    # The queue's limit: at most 3 of its jobs at once.
    queue_spans = [spans_by_id[j.pk][2:] for j in spans]
    assert max_overlap(queue_spans) <= 3
    # Each key's limit: at most 2 at once, the busy key included.
    by_key: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for j in [*busy, *keyed]:
        _, key, start, end = spans_by_id[j.pk]
        by_key[key].append((start, end))
    assert {key: max_overlap(s) <= 2 for key, s in by_key.items()} == dict.fromkeys(by_key, True)
    # The limits bound, and they were used: 24 threads ran more than 3 and 2 at once.
    assert max_overlap([(s[2], s[3]) for s in spans_by_id.values()]) > 3
    assert max_overlap(by_key["busy"]) == 2

    # The rate: no window of a second started more than 5 jobs of a key (claim times, as
    # the database recorded them).
    for key in ("r0", "r1"):
        starts = sorted(rows[j.pk].locked_at for j in rated if j.args[1] == key)
        assert len(starts) == 12
        assert all(b - a >= timedelta(seconds=1) for a, b in zip(starts, starts[5:], strict=False))

    # No head-of-line blocking: the other keys and the unlimited queue finished while the
    # busy key's backlog was still being worked off.
    busy_end = max(spans_by_id[j.pk][3] for j in busy)
    assert max(spans_by_id[j.pk][3] for j in keyed) < busy_end
    assert max(spans_by_id[j.pk][3] for j in free) < busy_end


def test_a_killed_workers_slots_come_back_with_the_rescue(spawn_worker, tmp_path):
    ledger = tmp_path / "ledger.txt"
    path = str(ledger)
    Queue.objects.set_limits("spans", concurrency=2, rate_limit=None, by="test")
    stuck = Span.dispatch_many([[path, "stuck", 30]] * 2)
    victim = spawn_worker("--concurrency", str(THREADS))
    wait_for(lambda: Job.objects.filter(state=JobState.RUNNING, queue="spans").count() == 2)
    later = Span.dispatch_many([[path, "later", 0.05]] * 6)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    # The dead worker holds both slots: nothing of the queue runs until they are rescued.
    Job.objects.filter(pk__in=[j.pk for j in stuck]).update(args=[path, "stuck", 0.05])
    survivors = [spawn_worker("--concurrency", str(THREADS)) for _ in range(PROCESSES - 1)]
    everything = [*stuck, *later]
    wait_for(
        lambda: (
            Job.objects.filter(pk__in=[j.pk for j in everything], state=JobState.SUCCEEDED).count()
            == len(everything)
        ),
        timeout=60,
    )
    for proc in survivors:
        stop_worker(proc)
    rescued = Job.objects.filter(pk__in=[j.pk for j in stuck])
    assert set(rescued.values_list("rescues", flat=True)) == {1}
    spans = read_ledger(ledger)
    assert sorted(s[0] for s in spans) == sorted(j.pk for j in everything)
    assert max_overlap([(s[2], s[3]) for s in spans]) <= 2
    assert not Job.objects.filter(state=JobState.RUNNING).exists()
