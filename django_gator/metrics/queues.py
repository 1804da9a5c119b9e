"""The queues' figures, read from the database (cached), as Prometheus gauges: the
:class:`QueueCollector` that :func:`view` serves."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from django.http import HttpRequest, HttpResponse

from django_gator import conf
from django_gator.databases import job_databases
from django_gator.metrics.cache import cached
from django_gator.metrics.client import client as prometheus


def queue_figures(alias: str | None = None) -> dict[str, Any]:
    """The queues' figures, read from the database at most once per
    ``GATOR_METRICS_CACHE_SECONDS`` through the Django cache ``GATOR_METRICS_CACHE``
    (see :func:`cached`). A figure is ``{"at": unix time read, "db_now": ...,
    "queues": [...]}``."""
    alias = alias or conf.database()
    return cached(f"django_gator:metrics:queues:{alias}", lambda: _read_figures(alias))


def _read_figures(alias: str) -> dict[str, Any]:
    """The figures, read with one statement (see engines/gauges.py): from the read replica
    when ``alias`` is GATOR_DATABASE and GATOR_READ_DATABASE names one that answers and
    lags within its bound (see django_gator.replicas)."""
    from django_gator import replicas
    from django_gator.engines import get_engine

    replica: dict[str, Any] | None = None
    if alias == conf.database():
        source = replicas.read_source()
        alias = source.alias
        if source.replica is not None:
            replica = {"read": source.on_replica, "lag": source.lag}
    db_now, gauges = get_engine(alias).queue_gauges()
    return {
        "at": time.time(),
        "replica": replica,
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
    """The queues' gauges, from :func:`queue_figures`: of ``alias``, or of every job
    database (GATOR_DATABASE and those of GATOR_QUEUE_DATABASES). With several, each
    gauge has a ``database`` label (the alias) besides ``queue``."""

    def __init__(self, alias: str | None = None) -> None:
        self.alias = alias

    def collect(self) -> Iterable[Any]:
        prometheus()
        from prometheus_client.core import GaugeMetricFamily as gauge

        aliases = [self.alias] if self.alias else job_databases()
        labels = ["queue", "database"] if len(aliases) > 1 else ["queue"]
        families = {
            key: gauge(f"gator_queue_{name}", text, labels=labels)
            for key, name, text in QUEUE_GAUGES
        }
        ages = gauge(
            "gator_queue_figures_age_seconds",
            "Seconds since the queue figures were read from the database",
            labels=labels[1:],
        )
        replica = None
        for alias in aliases:
            figures = queue_figures(alias)
            age = time.time() - figures["at"]
            where = [alias] if len(labels) > 1 else []
            for q in figures["queues"]:
                for key, family in families.items():
                    value = q.get(key)  # figures cached by an older version lack new keys
                    if key in ("oldest_due", "oldest_running"):
                        value = 0.0 if value is None else max(0.0, figures["db_now"] + age - value)
                    family.add_metric([q["queue"], *where], float(value))
            ages.add_metric(where, age)
            replica = replica or figures.get("replica")
        yield from families.values()
        yield ages
        if replica:  # GATOR_READ_DATABASE
            yield from _replica_gauges(gauge, replica)


#: (key in the figures, gauge name after ``gator_queue_``, help text)
QUEUE_GAUGES = (
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


def _replica_gauges(gauge: Any, replica: dict[str, Any]) -> Iterable[Any]:
    yield gauge(
        "gator_queue_figures_from_replica",
        "1 when the queue figures were read from GATOR_READ_DATABASE, 0 when from "
        "the primary (the replica lagged past its bound, or did not answer)",
        value=1.0 if replica["read"] else 0.0,
    )
    if replica["lag"] is not None:
        yield gauge(
            "gator_read_replica_lag_seconds",
            "Seconds GATOR_READ_DATABASE was behind the primary when the figures were read",
            value=float(replica["lag"]),
        )


def view(request: HttpRequest) -> HttpResponse:
    """The queues' figures in Prometheus' text format; mount it in your urls::

        path("metrics/gator", django_gator.metrics.view)

    It is not protected: put it where only your Prometheus reaches it, or wrap it
    (``staff_member_required``, a network rule)."""
    client = prometheus()
    registry = client.CollectorRegistry()
    registry.register(QueueCollector())
    from django_gator.metrics.workflows import WorkflowCollector  # imports the models

    registry.register(WorkflowCollector())
    return HttpResponse(client.generate_latest(registry), content_type=client.CONTENT_TYPE_LATEST)
