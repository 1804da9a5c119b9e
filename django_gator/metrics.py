"""Prometheus metrics (the ``django-gator[prometheus]`` extra): the worker's figures, the
endpoint that serves them, and :func:`view` for the queues' figures.

Nothing here imports ``prometheus_client`` until a worker is started with
``--metrics-port`` (:func:`enable`, :func:`serve`) or :func:`view` is called, and the
worker's hooks cost one module-attribute test per job while metrics are off
(``if metrics.enabled:``).

**What a worker records** (:func:`enable`), in its own process:

- ``gator_jobs_finished_total{job, queue, outcome}``: attempts that ended, by outcome
  (``succeeded``, ``failed`` (will retry), ``dead``, ``cancelled``, ``snoozed``);
- ``gator_job_run_seconds{job, queue}``: how long ``handle()`` ran (histogram);
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
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from django.core.cache import caches
from django.http import HttpRequest, HttpResponse
from django.utils.dateparse import parse_datetime

from django_gator import conf
from django_gator.attempts import Outcome
from django_gator.rows import ClaimedJob

#: True while this process records job metrics (after :func:`enable`). The worker's hooks
#: test it before calling in.
enabled = False

#: Seconds: buckets of the run-time and pickup-latency histograms.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_lock = threading.Lock()
_metrics: _WorkerMetrics | None = None
_busy: Callable[[], int] | None = None


class MetricsUnavailable(RuntimeError):
    """prometheus_client is not installed."""


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise MetricsUnavailable(
            "Prometheus metrics need prometheus_client: pip install 'django-gator[prometheus]'"
        ) from None
    return prometheus_client


class _WorkerMetrics:
    """The worker's metric objects, made once per process (after the multiprocess mode is
    decided: a metric reads it when it is made)."""

    def __init__(self) -> None:
        client = _client()
        self.finished = client.Counter(
            "gator_jobs_finished",
            "Job attempts that ended, by job name, queue and outcome",
            ["job", "queue", "outcome"],
        )
        self.run_time = client.Histogram(
            "gator_job_run_seconds",
            "Seconds a job's handle() ran",
            ["job", "queue"],
            buckets=BUCKETS,
        )
        self.pickup = client.Histogram(
            "gator_job_pickup_latency_seconds",
            "Seconds from a job's due time (next_execution_at) to its start",
            ["queue"],
            buckets=BUCKETS,
        )
        self.threads = client.Gauge(
            "gator_worker_threads", "Executor threads", multiprocess_mode="livesum"
        )
        self.busy = client.Gauge(
            "gator_worker_busy_threads",
            "Executor threads running a job (sampled at each heartbeat)",
            multiprocess_mode="livesum",
        )
        #: (job, queue, outcome) -> the labelled children of finished, run_time, pickup.
        self.children: dict[tuple[str, str, str], tuple[Any, Any, Any]] = {}
        self.heartbeat = client.Gauge(
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


# -- several processes -----------------------------------------------------------------------
def prepare_multiprocess_dir(path: str | None = None) -> str:
    """Make this process and the children it starts afterwards share their metrics
    through the directory ``path`` (a new temporary one by default; an existing one is
    emptied: files of an earlier run would be counted again). Returns the directory.
    Call it before starting any child and before :func:`enable`."""
    if path is None:
        path = tempfile.mkdtemp(prefix="gator-metrics-")
    else:
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(path):
            if name.endswith(".db"):
                os.remove(os.path.join(path, name))
    os.environ[MULTIPROC_ENV] = path
    _client()
    from prometheus_client import values

    # prometheus_client picks the storage of new metrics when it is first imported; it may
    # have been imported before the directory was chosen (by the project, or a library).
    values.ValueClass = values.MultiProcessValue()
    return path


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


def mark_dead(pid: int) -> None:
    """A child process exited: drop its live gauges (threads, busy threads, heartbeat)."""
    path = multiprocess_dir()
    if path is not None:
        _client()
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, path)


def remove_multiprocess_dir(path: str) -> None:
    """Remove a directory :func:`prepare_multiprocess_dir` made (at the supervisor's exit)."""
    shutil.rmtree(path, ignore_errors=True)


class MetricsServer:
    """The HTTP server of ``/metrics`` (a daemon thread); :meth:`close` stops it."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.port: int = server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class MetricsPortBusy(ValueError):
    """The port given to ``--metrics-port`` cannot be listened on."""


def serve(port: int, addr: str = "") -> MetricsServer:
    """Serve ``/metrics`` on ``addr:port`` (every interface by default) from a daemon
    thread: this process's metrics, or, in multiprocess mode, those of every process
    sharing the directory. Raises :class:`MetricsPortBusy` naming the port."""
    client = _client()
    registry = _served_registry(client)
    try:
        # Every interface by default: Prometheus scrapes the worker from another host.
        any_interface = "0.0.0.0"  # noqa: S104
        server, thread = client.start_http_server(
            port, addr=addr or any_interface, registry=registry
        )
    except OSError as exc:
        raise MetricsPortBusy(
            f"cannot serve metrics on port {port}: {exc.strerror or exc}"
        ) from None
    return MetricsServer(server, thread)


def _served_registry(client: Any) -> Any:
    path = multiprocess_dir()
    if path is None:
        source: Any = client.REGISTRY
    else:
        from prometheus_client import multiprocess

        source = client.CollectorRegistry()
        multiprocess.MultiProcessCollector(source, path=path)
    registry = client.CollectorRegistry()
    registry.register(_Combined(source))
    return registry


class _Combined:
    """A registry's metrics, and the heartbeat ages computed from their timestamps."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        now = time.time()
        ages = None
        for family in self.source.collect():
            yield family
            if family.name == "gator_worker_heartbeat_timestamp_seconds":
                ages = GaugeMetricFamily(
                    "gator_worker_heartbeat_age_seconds",
                    "Seconds since the worker's last heartbeat",
                    labels=sorted({k for s in family.samples for k in s.labels}),
                )
                for sample in family.samples:
                    if not sample.value:
                        continue  # no heartbeat yet
                    labels = [sample.labels[k] for k in sorted(sample.labels)]
                    ages.add_metric(labels, max(0.0, now - sample.value))
        if ages is not None:
            yield ages


# -- the queues' figures (the view) ------------------------------------------------------
def queue_figures(alias: str | None = None) -> dict[str, Any]:
    """The queues' figures, read from the database at most once per
    ``GATOR_METRICS_CACHE_SECONDS`` through the Django cache ``GATOR_METRICS_CACHE``.

    With a cache the replicas share (Redis, Memcached, the database cache), one replica
    refreshes them per interval: the first to take a short lock (``cache.add``) reads the
    database, and the others serve the figures stored until the new ones are in. With
    a per-process cache (LocMemCache, Django's default) each process refreshes once per
    interval. A figure is ``{"at": unix time read, "db_now": ..., "queues": [...]}``."""
    alias = alias or conf.database()
    interval = conf.metrics_cache_seconds()
    if interval <= 0:
        return _read_figures(alias)
    cache = caches[conf.metrics_cache()]
    key = f"django_gator:metrics:queues:{alias}"
    figures: dict[str, Any] | None = cache.get(key)
    if figures is not None and time.time() - figures["at"] < interval:
        return figures
    # Whoever takes the lock refreshes; the others keep serving what is stored.
    if figures is not None and not cache.add(f"{key}:refresh", 1, timeout=max(interval, 1)):
        return figures
    figures = _read_figures(alias)
    cache.set(key, figures, timeout=max(interval * 4, 60))
    return figures


def _read_figures(alias: str) -> dict[str, Any]:
    """The figures, read with one statement (see engines/gauges.py)."""
    from django_gator.engines import get_engine

    db_now, gauges = get_engine(alias).queue_gauges()
    return {
        "at": time.time(),
        "db_now": db_now.timestamp(),
        "queues": [
            {
                "queue": q.queue,
                "ready": q.ready,
                "scheduled": q.scheduled,
                "running": q.running,
                "dead": q.dead,
                "oldest_due": None if q.oldest_due_at is None else q.oldest_due_at.timestamp(),
                "oldest_running": (
                    None if q.oldest_running_at is None else q.oldest_running_at.timestamp()
                ),
                "paused": q.paused,
            }
            for q in gauges
        ],
    }


class QueueCollector:
    """The queues' gauges, from :func:`queue_figures`."""

    def __init__(self, alias: str | None = None) -> None:
        self.alias = alias

    def collect(self) -> Iterable[Any]:
        _client()
        from prometheus_client.core import GaugeMetricFamily as gauge

        figures = queue_figures(self.alias)
        age = time.time() - figures["at"]
        families = {
            key: gauge(f"gator_queue_{name}", text, labels=["queue"])
            for key, name, text in (
                ("ready", "ready_jobs", "Waiting or failed jobs due now"),
                ("scheduled", "scheduled_jobs", "Waiting or failed jobs due later"),
                ("running", "running_jobs", "Running jobs"),
                ("dead", "dead_jobs", "Dead jobs"),
                ("oldest_due", "oldest_due_age_seconds", "Age of the oldest ready job"),
                (
                    "oldest_running",
                    "oldest_running_age_seconds",
                    "Seconds the oldest running job has run (since its claim)",
                ),
                ("paused", "paused", "1 when the queue is paused"),
            )
        }
        for q in figures["queues"]:
            for key, family in families.items():
                value = q.get(key)  # figures cached by an older version lack new keys
                if key in ("oldest_due", "oldest_running"):
                    value = 0.0 if value is None else max(0.0, figures["db_now"] + age - value)
                family.add_metric([q["queue"]], float(value))
        yield from families.values()
        yield gauge(
            "gator_queue_figures_age_seconds",
            "Seconds since the queue figures were read from the database",
            value=age,
        )


def view(request: HttpRequest) -> HttpResponse:
    """The queues' figures in Prometheus' text format; mount it in your urls::

        path("metrics/gator", django_gator.metrics.view)

    It is not protected: put it where only your Prometheus reaches it, or wrap it
    (``staff_member_required``, a network rule)."""
    client = _client()
    registry = client.CollectorRegistry()
    registry.register(QueueCollector())
    return HttpResponse(client.generate_latest(registry), content_type=client.CONTENT_TYPE_LATEST)
