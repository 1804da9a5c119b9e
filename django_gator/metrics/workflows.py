"""Workflows' waits and signals as Prometheus metrics, served by :func:`~django_gator.metrics.view`
with the queues' figures:

- ``gator_workflow_open_waits{queue}``: wait steps waiting for their signal (their
  ``gator.wait`` job not ended), by the queue of that job;
- ``gator_workflow_oldest_wait_age_seconds{queue}``: seconds since the oldest of them was
  reached (its job inserted);
- ``gator_workflow_open_sleeps{queue}``: sleep steps not ended;
- ``gator_workflow_signals_total{outcome}``: signals sent from this process
  (``WorkflowRun.signal`` / ``reject``, ``gator_workflow signal``, the admin's Approve
  and Reject), by outcome: ``delivered``, ``rejected`` (a reject applied), ``duplicate``
  (one of that name had come: nothing changed) and ``refused`` (a ``WorkflowError``: an
  unknown workflow or signal, an ended wait). Counted once the signal's transaction
  commits (a refusal at once), in the process that sent it: each process serving
  :func:`~django_gator.metrics.view` reports its own, so scrape each (Prometheus sums
  them over ``instance``).

The gauges come from the jobs table: the unfinished rows of the two internal job names,
which PostgreSQL and SQLite read from an index of those rows alone (migration 0029,
``django_gator.indexes.open_steps_index``) and MySQL and MariaDB through the state index
(every unfinished job), cached like the queues' figures (``GATOR_METRICS_CACHE_SECONDS``).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from django_gator import conf
from django_gator.metrics.cache import cached
from django_gator.metrics.client import client as prometheus
from django_gator.states import WAIT_JOB

#: The outcomes of a signal, each always reported (0 until one happens).
SIGNAL_OUTCOMES = ("delivered", "rejected", "duplicate", "refused")

_lock = threading.Lock()
_signals: Counter[str] = Counter()


def count_signal(outcome: str) -> None:
    """One more signal with ``outcome`` (the hook ``models.workflows.signal_hooks`` calls)."""
    with _lock:
        _signals[outcome] += 1


def signal_counts() -> dict[str, int]:
    """The signals this process sent, by outcome."""
    with _lock:
        return {outcome: _signals[outcome] for outcome in SIGNAL_OUTCOMES}


def wait_figures(alias: str | None = None) -> dict[str, Any]:
    """``{"at": unix time read, "queues": {queue: {"waits", "sleeps", "oldest_wait"}}}``,
    read at most once per ``GATOR_METRICS_CACHE_SECONDS``."""
    alias = alias or conf.database()
    return cached(f"django_gator:metrics:workflows:{alias}", lambda: _read(alias))


def _read(alias: str) -> dict[str, Any]:
    from django.db.models import Count, Min

    from django_gator.indexes import ACTIVE_STATES, OPEN_STEP_JOBS
    from django_gator.models import Job

    rows = (  # the condition of open_steps_index(), term for term
        Job.objects.using(alias)
        .filter(name__in=OPEN_STEP_JOBS, state__in=ACTIVE_STATES)
        .values("queue", "name")
        .annotate(open=Count("id"), oldest=Min("created_at"))
        .order_by()
    )
    queues: dict[str, dict[str, Any]] = {}
    for row in rows:
        entry = queues.setdefault(row["queue"], {"waits": 0, "sleeps": 0, "oldest_wait": None})
        if row["name"] == WAIT_JOB:
            entry["waits"] = row["open"]
            entry["oldest_wait"] = row["oldest"].timestamp()
        else:
            entry["sleeps"] = row["open"]
    return {"at": time.time(), "queues": queues}


class WorkflowCollector:
    """The gauges of open waits and sleeps, and this process's signal counts."""

    def __init__(self, alias: str | None = None) -> None:
        self.alias = alias

    def collect(self) -> Iterable[Any]:
        prometheus()
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        figures = wait_figures(self.alias)
        now = time.time()  # against the rows' created_at: this machine's clock
        waits = GaugeMetricFamily(
            "gator_workflow_open_waits",
            "Workflow wait steps waiting for their signal",
            labels=["queue"],
        )
        oldest = GaugeMetricFamily(
            "gator_workflow_oldest_wait_age_seconds",
            "Seconds since the oldest open wait step was reached",
            labels=["queue"],
        )
        sleeps = GaugeMetricFamily(
            "gator_workflow_open_sleeps", "Workflow sleep steps not ended", labels=["queue"]
        )
        for queue, entry in sorted(figures["queues"].items()):
            waits.add_metric([queue], float(entry["waits"]))
            sleeps.add_metric([queue], float(entry["sleeps"]))
            since = entry["oldest_wait"]
            oldest.add_metric([queue], 0.0 if since is None else max(0.0, now - since))
        signals = CounterMetricFamily(
            "gator_workflow_signals",
            "Signals sent to workflows from this process, by outcome",
            labels=["outcome"],
        )
        for outcome, count in signal_counts().items():
            signals.add_metric([outcome], float(count))
        yield from (waits, oldest, sleeps, signals)
