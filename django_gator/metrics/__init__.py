"""Prometheus metrics (the ``django-gator[prometheus]`` extra): the worker's figures, the
endpoint that serves them, and :func:`view` for the queues' figures.

Nothing here imports ``prometheus_client`` until a worker is started with
``--metrics-port`` (:func:`enable`, :func:`serve`) or :func:`view` is called, and the
worker's hooks cost one module-attribute test per job while metrics are off
(``if metrics.enabled:``).

**What a worker records** (:func:`enable`), in its own process:

- ``gator_jobs_finished_total{job, queue, outcome}``: attempts that ended, by outcome
  (``succeeded``, ``failed`` (will retry), ``dead``, ``cancelled``, ``snoozed``; and
  ``expired`` for a job the worker's expiry sweep ended before it started);
- ``gator_job_run_seconds{job, queue}``: how long ``handle()`` ran (histogram);
- ``gator_job_progress_items_total{job, queue}``: items running jobs reported done with
  ``self.progress()``, counted at each progress write from each attempt's first report
  (its rate is the jobs' throughput);
- ``gator_job_pickup_latency_seconds{queue}``: from the job's due time (its
  ``next_execution_at``) to its start (histogram; the worker's clock against the
  database's, so clock skew between them shows here);
- ``gator_worker_threads`` and ``gator_worker_busy_threads``: executor threads, and those
  running a job, sampled at each heartbeat;
- ``gator_worker_heartbeat_timestamp_seconds`` (set at each heartbeat), and at scrape time
  ``gator_worker_heartbeat_age_seconds``: seconds since it (it grows when heartbeats stall).

**Several processes, one endpoint.** prometheus_client's multiprocess mode: each process
writes its values to memory-mapped files in one directory, and the process that serves
the endpoint adds them up at scrape time. A supervisor of worker processes:

1. calls :func:`prepare_multiprocess_dir` before it starts any child (children inherit the
   directory through ``PROMETHEUS_MULTIPROC_DIR``);
2. calls :func:`serve` itself, once: it serves the sum of every child's files;
3. each child calls :func:`enable` (as ``gator_worker --metrics-port`` does in one process)
   and :func:`track` with its ``WorkerProcess``;
4. when a child exits, calls :func:`mark_dead` with its pid, so its threads and busy
   threads leave the live sums (its counters and histograms stay counted).

**Queue figures** (:func:`view`, mounted in a project's urls) come from the database, at
most once per ``GATOR_METRICS_CACHE_SECONDS`` through Django's cache
``GATOR_METRICS_CACHE`` (see :func:`queue_figures`).

The worker's figures are kept here; the multiprocess directory is in
:mod:`~django_gator.metrics.multiprocess`, the endpoint in
:mod:`~django_gator.metrics.server`, the queues' figures and :func:`view` in
:mod:`~django_gator.metrics.queues`; their public names are importable from here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from django_gator.attempts import Outcome
from django_gator.metrics.client import MetricsUnavailable, client
from django_gator.metrics.multiprocess import (
    MULTIPROC_ENV,
    mark_dead,
    multiprocess_dir,
    prepare_multiprocess_dir,
    remove_multiprocess_dir,
)
from django_gator.metrics.queues import QueueCollector, queue_figures, view
from django_gator.metrics.server import MetricsPortBusy, MetricsServer, serve
from django_gator.rows import ClaimedJob

#: True while this process records job metrics (after :func:`enable`). The worker's hooks
#: test it before calling in.
enabled = False

#: Seconds: buckets of the run-time and pickup-latency histograms.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

_lock = threading.Lock()
_metrics: _WorkerMetrics | None = None
_busy: Callable[[], int] | None = None


class _WorkerMetrics:
    """The worker's metric objects, made once per process (after the multiprocess mode is
    decided: a metric reads it when it is made)."""

    def __init__(self) -> None:
        prometheus = client()
        self.finished = prometheus.Counter(
            "gator_jobs_finished",
            "Job attempts that ended, by job name, queue and outcome",
            ["job", "queue", "outcome"],
        )
        self.run_time = prometheus.Histogram(
            "gator_job_run_seconds",
            "Seconds a job's handle() ran",
            ["job", "queue"],
            buckets=BUCKETS,
        )
        self.pickup = prometheus.Histogram(
            "gator_job_pickup_latency_seconds",
            "Seconds from a job's due time (next_execution_at) to its start",
            ["queue"],
            buckets=BUCKETS,
        )
        self.progress = prometheus.Counter(
            "gator_job_progress_items",
            "Items running jobs reported done with progress(), by job name and queue",
            ["job", "queue"],
        )
        self.threads = prometheus.Gauge(
            "gator_worker_threads", "Executor threads", multiprocess_mode="livesum"
        )
        self.busy = prometheus.Gauge(
            "gator_worker_busy_threads",
            "Executor threads running a job (sampled at each heartbeat)",
            multiprocess_mode="livesum",
        )
        #: (job, queue, outcome) -> the labelled children of finished, run_time, pickup.
        self.children: dict[tuple[str, str, str], tuple[Any, Any, Any]] = {}
        self.heartbeat = prometheus.Gauge(
            "gator_worker_heartbeat_timestamp_seconds",
            "Unix time of the worker's last heartbeat",
            multiprocess_mode="liveall",
        )


# -- the worker's side ---------------------------------------------------------------------
def enable() -> None:
    """Record this process's job metrics from now on (a worker process; idempotent)."""
    global _metrics, enabled
    with _lock:
        if _metrics is None:
            _metrics = _WorkerMetrics()
        enabled = True


def disable() -> None:
    """Stop recording (tests). The metric objects stay registered."""
    global enabled
    enabled = False


def track(concurrency: int, busy: Callable[[], int]) -> None:
    """Report ``concurrency`` executor threads, and sample ``busy()`` (threads running a
    job) at each heartbeat: ``track(worker.concurrency, lambda: len(worker.slots.running))``.
    """
    global _busy
    if _metrics is None:
        return
    _busy = busy
    _metrics.threads.set(concurrency)


def job_finished(job: ClaimedJob, outcome: Outcome, elapsed_ms: float) -> None:
    """An attempt of ``job`` ended with ``outcome`` after ``elapsed_ms`` (the outcome
    writer's hook)."""
    m = _metrics
    if m is None:
        return
    label = outcome.label
    key = (job.name, job.queue, label)
    children = m.children.get(key)
    if children is None:
        # labels() validates and locks: its children are kept, one lookup per job.
        children = m.children[key] = (
            m.finished.labels(job.name, job.queue, label),
            m.run_time.labels(job.name, job.queue),
            m.pickup.labels(job.queue),
        )
    finished, run_time, pickup = children
    finished.inc()
    seconds = elapsed_ms / 1000
    run_time.observe(seconds)
    due = _timestamp(job.next_execution_at)
    if due is not None:
        pickup.observe(max(0.0, time.time() - seconds - due))


def job_expired(name: str, queue: str) -> None:
    """A job of ``name`` in ``queue`` expired before it started (the expiry sweep's hook):
    counted under the outcome ``expired``."""
    m = _metrics
    if m is None:
        return
    m.finished.labels(name, queue, "expired").inc()


def job_progress(job: ClaimedJob, delta: float) -> None:
    """A running attempt of ``job`` wrote progress ``delta`` items further on."""
    m = _metrics
    if m is None:
        return
    m.progress.labels(job.name, job.queue).inc(delta)


def heartbeat() -> None:
    """The worker wrote a heartbeat (the lifeline's hook)."""
    m = _metrics
    if m is None:
        return
    m.heartbeat.set(time.time())
    if _busy is not None:
        m.busy.set(_busy())


def _timestamp(value: Any) -> float | None:
    """Unix time of a datetime as a claim returned it (text on SQLite; naive means UTC)."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if not isinstance(value, datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


__all__ = [
    "BUCKETS",
    "MULTIPROC_ENV",
    "MetricsPortBusy",
    "MetricsServer",
    "MetricsUnavailable",
    "QueueCollector",
    "disable",
    "enable",
    "enabled",
    "heartbeat",
    "job_expired",
    "job_finished",
    "job_progress",
    "mark_dead",
    "multiprocess_dir",
    "prepare_multiprocess_dir",
    "queue_figures",
    "remove_multiprocess_dir",
    "serve",
    "track",
    "view",
]
