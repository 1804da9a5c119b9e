"""The HTTP server of a worker's ``/metrics`` (``gator_worker --metrics-port``), with the
heartbeat ages computed at scrape time."""

from __future__ import annotations

import glob
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from django_gator.metrics.client import client as prometheus
from django_gator.metrics.multiprocess import multiprocess_dir


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
    client = prometheus()
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
        source = client.CollectorRegistry()
        source.register(_ProcessFiles(path))
    registry = client.CollectorRegistry()
    registry.register(_Combined(source))
    return registry


class _ProcessFiles:
    """The metrics of every process sharing the multiprocess directory, as prometheus_client's
    MultiProcessCollector reads them, without its empty files: a process creates its file
    before it sizes it, and a scrape in between failed whole (``struct.error``, HTTP 500;
    a worker process started by the supervisor meets it; prometheus/client_python#1199). A
    process SIGKILLed in that window (the supervisor kills wedged ones) would leave the
    empty file for good, and every scrape after it would fail. (A live gauge's file that
    mark_dead removes during the read the library skips itself.)"""

    def __init__(self, path: str) -> None:
        self.path = path

    def collect(self) -> Any:
        from prometheus_client.multiprocess import MultiProcessCollector

        files = [f for f in glob.glob(os.path.join(self.path, "*.db")) if _sized(f)]
        return MultiProcessCollector.merge(files, accumulate=True)


def _sized(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False  # gone since the listing


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
