"""Jobs and measurements for ``manage.py gator_bench``. Imported only by that command."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from django_gator import conf
from django_gator.engines import get_engine, schema
from django_gator.models import FlowStart, Job, JobState, Queue
from django_gator.queueable import Queueable
from django_gator.worker.queues import QueueSpec
from django_gator.worker.supervisor import WorkerProcess

QUEUE = "gator-bench"
_started: dict[int, float] = {}
_started_event = threading.Event()


class BenchNoop(Queueable):
    name = "django_gator.bench.noop"
    queue = QUEUE

    def handle(self, *args: Any) -> None:
        return None


class BenchSecret(Queueable):
    """A no-op with ``encrypted = True`` (``--encrypted``: the cost of encryption)."""

    name = "django_gator.bench.secret"
    queue = QUEUE
    encrypted = True

    def handle(self, *args: Any) -> None:
        return None


class BenchKeyed(Queueable):
    """A no-op with a per-key limit: one running per key (``--flow keys``)."""

    name = "django_gator.bench.keyed"
    queue = QUEUE
    concurrency_limit = 1

    def concurrency_key(self, i: int) -> str:
        return f"k{i % FLOW_KEYS}"

    def handle(self, *args: Any) -> None:
        return None


#: ``--flow keys``: the keys the jobs spread over; ``--flow queue``: the queue's limit.
FLOW_KEYS = 1000
FLOW_QUEUE_LIMIT = 1000
FLOWS = ("none", "queue", "keys")


class BenchLatency(Queueable):
    """Notes the moment it starts, for the pickup-latency measurement."""

    name = "django_gator.bench.latency"
    queue = QUEUE

    def handle(self) -> None:
        assert self.job_id is not None
        _started[self.job_id] = time.perf_counter()
        _started_event.set()


@dataclass
class Report:
    database: str
    lines: list[tuple[str, str]] = field(default_factory=list)

    def add(self, label: str, value: str) -> None:
        self.lines.append((label, value))


#: Descriptions of the benchmark's batches: its Batch, and a batch step's batch.
BENCH_BATCHES = ("bench", f"bench: step 0 ({BenchNoop.name})")


def clean() -> int:
    """Delete the benchmark's rows. On PostgreSQL also VACUUM the jobs table, so that each
    measurement starts without the dead rows of the previous one (docs/benchmarks.md shows
    what those cost)."""
    from django_gator.models import Batch, WorkflowRun

    alias = conf.database()
    deleted, _ = Job.objects.using(alias).filter(queue=QUEUE).delete()
    # The benchmark's own batches and workflows (those of bench_drain's batch step too).
    Batch.objects.using(alias).filter(description__in=BENCH_BATCHES).delete()
    WorkflowRun.objects.using(alias).filter(name="bench").delete()
    Queue.objects.using(alias).filter(name=QUEUE).delete()
    FlowStart.objects.using(alias).filter(scope__startswith=f"job:{BenchKeyed.name}|").delete()
    schema.vacuum_jobs(get_engine(alias))
    return deleted


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def bench_dispatch(count: int, *, encrypted: bool = False) -> float:
    """Jobs per second, one dispatch() per job, each its own autocommit transaction."""
    job_class = BenchSecret if encrypted else BenchNoop
    elapsed = timed(lambda: [job_class.dispatch(i) for i in range(count)])
    return count / elapsed


def bench_dispatch_many(count: int, batch: int, *, encrypted: bool = False) -> float:
    job_class = BenchSecret if encrypted else BenchNoop

    def run() -> None:
        for start in range(0, count, batch):
            job_class.dispatch_many([[i] for i in range(start, min(start + batch, count))])

    return count / timed(run)


def bench_batch_dispatch(count: int, rounds: int) -> list[tuple[float, float]]:
    """(seconds without, seconds with) a Batch around one dispatch_many of ``count`` jobs,
    measured alternately ``rounds`` times, each on an emptied table (issue 18's bar: the
    batch costs at most 1.5 times the plain call)."""
    from django_gator.models import Batch

    items = [[i] for i in range(count)]
    out = []

    def batched() -> None:
        with Batch(on_complete=BenchNoop.name, description="bench"):
            BenchNoop.dispatch_many(items)

    for _ in range(rounds):
        clean()
        plain_s = timed(lambda: BenchNoop.dispatch_many(items))
        clean()
        out.append((plain_s, timed(batched)))
    clean()
    return out


def bench_batch_step_dispatch(count: int, rounds: int) -> list[tuple[float, float]]:
    """(seconds in a Batch, seconds as a workflow's batch step) for ``count`` jobs: a
    ``dispatch_many`` inside ``with Batch(...)``, and a one-step Workflow whose step is
    ``add_batch()`` of the same items, alternately ``rounds`` times, each on an emptied
    table (what a batch step costs at dispatch over the batch it is made of)."""
    from django_gator.models import Batch
    from django_gator.workflows import Workflow

    items = [[i] for i in range(count)]
    out = []

    def batched() -> None:
        with Batch(description="bench"):
            BenchNoop.dispatch_many(items)

    def step() -> None:
        workflow = Workflow(name="bench")
        workflow.add_batch(BenchNoop, items)
        workflow.dispatch()

    for _ in range(rounds):
        clean()
        batch_s = timed(batched)
        clean()
        out.append((batch_s, timed(step)))
    clean()
    return out


def rss_mb() -> float:
    """This process's resident memory in MiB (Linux; 0.0 elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def bench_drain(
    count: int,
    concurrency: int,
    batch: int = 10_000,
    *,
    in_batch: bool = False,
    in_step: bool = False,
    flow: str = "none",
    encrypted: bool = False,
) -> tuple[float, float, float]:
    """(jobs per second, RSS MiB before, RSS MiB after) for one burst worker draining
    ``count`` no-op jobs (``in_batch``: members of one Batch; ``in_step``: members of a
    one-step workflow's batch step, ``add_batch()``). ``flow``: ``queue`` gives
    the queue a concurrency limit of FLOW_QUEUE_LIMIT (which never binds), ``keys`` drains
    a class limited to one running job per key over FLOW_KEYS keys (the limited claim, for
    the cost of flow control). ``encrypted``: the jobs' class has ``encrypted = True``."""
    from django_gator.models import Batch
    from django_gator.workflows import Workflow

    clean()
    job_class: type[Queueable] = BenchKeyed if flow == "keys" else BenchNoop
    if encrypted:
        job_class = BenchSecret
    if flow == "queue":
        Queue.objects.using(conf.database()).set_limits(
            QUEUE, concurrency=FLOW_QUEUE_LIMIT, rate_limit=None, by="gator_bench"
        )
    if in_step:
        workflow = Workflow(name="bench")
        workflow.add_batch(BenchNoop, [[i] for i in range(count)])
        workflow.dispatch()
    else:
        with Batch(on_complete=BenchNoop.name, description="bench") if in_batch else nullcontext():
            for start in range(0, count, batch):
                job_class.dispatch_many([[i] for i in range(start, min(start + batch, count))])
    worker = WorkerProcess(
        [QueueSpec(QUEUE)], concurrency=concurrency, burst=True, install_signal_handlers=False
    )
    before = rss_mb()
    elapsed = timed(worker.run)
    after = rss_mb()
    done = (
        Job.objects.using(conf.database())
        .filter(queue=QUEUE, state=JobState.SUCCEEDED, batch_id__isnull=not (in_batch or in_step))
        .count()
    )
    if done != count:
        raise RuntimeError(f"drain finished {done} of {count} jobs")
    return count / elapsed, before, after


def _bench_task_noop(i: int) -> None:
    """The no-op task of the Tasks-framework drain (module level, as the framework wants)."""
    return None


def _bench_task() -> Any:
    from django_gator.tasks import gator_backend

    backend = gator_backend()
    if backend.queues:
        backend.queues.add(QUEUE)
    return backend.task_class(func=_bench_task_noop, queue_name=QUEUE, backend=backend.alias)


def bench_task_enqueue(count: int) -> float:
    """Tasks per second through ``Task.enqueue()``, one at a time (autocommit)."""
    task = _bench_task()
    clean()
    return count / timed(lambda: [task.enqueue(i) for i in range(count)])


def bench_drain_tasks(count: int, concurrency: int, batch: int = 10_000) -> float:
    """Tasks per second for one burst worker draining ``count`` no-op @task calls: the
    same rows as ``Task.enqueue()`` makes, inserted in bulk, then run through the
    framework layer (a get_result read and the framework's signals per task)."""
    task = _bench_task()
    job_class = task.get_backend().job_class(task)
    clean()
    for start in range(0, count, batch):
        job_class.dispatch_many([[i] for i in range(start, min(start + batch, count))])
    worker = WorkerProcess(
        [QueueSpec(QUEUE)], concurrency=concurrency, burst=True, install_signal_handlers=False
    )
    elapsed = timed(worker.run)
    done = Job.objects.using(conf.database()).filter(queue=QUEUE, state=JobState.SUCCEEDED).count()
    if done != count:
        raise RuntimeError(f"task drain finished {done} of {count} tasks")
    return count / elapsed


def bench_latency(samples: int, concurrency: int) -> tuple[float, float]:
    """(p50, p90) milliseconds from the commit of a dispatch to the start of the job, with
    an idle worker running in this process."""
    clean()
    worker = WorkerProcess(
        [QueueSpec(QUEUE)], concurrency=concurrency, install_signal_handlers=False
    )

    def run_worker() -> None:
        try:
            worker.run()
        finally:
            connections.close_all()  # this thread's own connection

    thread = threading.Thread(target=run_worker, name="gator-bench-worker", daemon=True)
    thread.start()
    latencies: list[float] = []
    try:
        time.sleep(0.5)  # let the worker settle into its idle wait
        for _ in range(samples):
            _started_event.clear()
            committed = time.perf_counter()  # autocommit: committed when dispatch returns
            job = BenchLatency.dispatch()
            committed = (committed + time.perf_counter()) / 2
            if not _started_event.wait(30):
                raise RuntimeError("a latency job did not start within 30 s")
            latencies.append((_started[job.pk] - committed) * 1000)
            time.sleep(0.02)
    finally:
        worker.request_stop()
        thread.join(30)
        connections.close_all()
    quantiles = statistics.quantiles(latencies, n=10)
    return statistics.median(latencies), quantiles[8]
