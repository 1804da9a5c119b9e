"""Health: the worker's health file (``gator_worker --health-file``) and the checks of
``gator_status --check``.

The health file is touched at start-up and at every heartbeat, so its modification time
says when the worker last wrote its heartbeat; a probe that finds it older than a few
heartbeat intervals knows the worker is stuck (the classic Kubernetes exec probe:
``find /tmp/gator-alive -mmin -1 | grep -q .``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from django.db import DatabaseError

from django_gator import conf, metrics, schema, stats, wording
from django_gator.engines import get_engine
from django_gator.logutil import safe

if TYPE_CHECKING:
    from datetime import datetime

    from django_gator.engines.gauges import QueueGauge

logger = logging.getLogger("django_gator.worker")

_path: str | None = None


class BadHealthFile(ValueError):
    """The health file cannot be written where ``--health-file`` says."""


def configure(path: str | None) -> None:
    """Touch ``path`` now and at every heartbeat of this process (None: no file).
    Raises :class:`BadHealthFile` naming the path when it cannot be written."""
    global _path
    if path is None:
        _path = None
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise BadHealthFile(f"--health-file {path!r}: the directory {directory!r} does not exist")
    try:
        touch(path)
    except OSError as exc:
        raise BadHealthFile(f"--health-file {path!r}: {exc.strerror or exc}") from None
    _path = path


def touch(path: str, at: float | None = None) -> None:
    """Create ``path`` if need be and set its modification time to ``at`` (time.time();
    None: now)."""
    with open(path, "a"):
        pass
    os.utime(path, None if at is None else (at, at))


def beat() -> None:
    """This worker wrote a heartbeat (the lifeline's hook): touch the health file, and
    note it in the metrics."""
    if _path is not None:
        try:
            touch(_path)
        except OSError as exc:
            logger.warning("Could not touch the health file path=%s error=%s", safe(_path), exc)
    if metrics.enabled:
        metrics.heartbeat()


@dataclass(frozen=True)
class Health:
    """What :func:`check` found: ``problems`` is empty when all is well."""

    problems: list[str]
    live_workers: int
    queues: int

    @property
    def healthy(self) -> bool:
        return not self.problems


#: Long runners named one by one in a check's problems (the rest are counted).
LONG_RUNNERS_NAMED = 10


def check(
    alias: str | None = None,
    *,
    max_latency: float | None = None,
    min_workers: int = 1,
    max_running: float | None = None,
    lag: float = 0.0,
) -> Health:
    """Is the job system healthy? Problems: the database does not answer (or lacks the
    tables), fewer than ``min_workers`` live workers (heartbeat within
    ``GATOR_HEARTBEAT_TIMEOUT``), a live worker whose heartbeat is stale (older than half
    of it: see :func:`.stats.stale_after`), a queue that is not paused whose oldest due job
    has waited more than ``max_latency`` seconds, a job running (since its claim) for more
    than ``max_running`` seconds: one problem per such job, naming its id, name, worker
    and age (a job with no timeout that blocks for ever shows here). ``lag``: seconds the
    database ``alias`` (a read replica) is behind; its rows are judged as of then."""
    alias = alias or conf.database()
    try:
        missing = schema.missing_tables(alias)
        if missing:
            return Health([schema.missing_tables_message(alias, missing)], 0, 0)
        # The queues' gauges (one statement, with the database's now), as a scrape reads them.
        now, queues = get_engine(alias).queue_gauges()
        # A replica ``lag`` seconds behind shows the rows of that long ago: judge them then.
        now -= timedelta(seconds=lag)
        live = stats.workers(alias, now=now)
        runners: list[stats.LongRunner] = []
        if max_running is not None and any(
            q.oldest_running_at is not None
            and (now - q.oldest_running_at).total_seconds() > max_running
            for q in queues
        ):
            runners = stats.long_runners(max_running, alias, now=now, limit=LONG_RUNNERS_NAMED + 1)
    except DatabaseError as exc:
        return Health([f"database {alias!r} unreachable: {safe(str(exc), 300)}"], 0, 0)
    problems = _worker_problems(live, min_workers)
    if max_latency is not None:
        problems += _latency_problems(queues, now, max_latency)
    if max_running is not None:
        problems += _runner_problems(runners, max_running)
    return Health(problems, len(live), len(queues))


def _worker_problems(live: list[stats.WorkerStats], min_workers: int) -> list[str]:
    """Too few live workers, and each live worker whose heartbeat is stale."""
    problems = []
    if len(live) < min_workers:
        problems.append(
            "no live worker"
            if not live
            else f"{len(live)} live workers, fewer than --min-workers {min_workers}"
        )
    for w in live:
        if w.stale:
            problems.append(
                f"worker {safe(w.id, 100)}: heartbeat {w.heartbeat_age:.1f} s old, stale (more "
                f"than half of GATOR_HEARTBEAT_TIMEOUT, {conf.heartbeat_timeout():g} s): frozen, "
                "cut off from the database, or dead and not yet declared lost; it holds "
                f"{wording.count(w.running, 'running job')}"
            )
    return problems


def _latency_problems(queues: list[QueueGauge], now: datetime, max_latency: float) -> list[str]:
    """Each queue, not paused, whose oldest due job has waited over ``max_latency``."""
    problems = []
    for q in queues:
        if q.paused or q.oldest_due_at is None:
            continue
        age = max(0.0, (now - q.oldest_due_at).total_seconds())
        if age > max_latency:
            problems.append(
                f"queue {safe(q.queue, 100)!r}: its oldest due job has waited {age:.1f} s, "
                f"more than --max-latency {max_latency:g}"
            )
    return problems


def _runner_problems(runners: list[stats.LongRunner], max_running: float) -> list[str]:
    """The first LONG_RUNNERS_NAMED jobs running over ``max_running``, then whether there
    are more."""
    problems = [
        f"job {runner.id} ({safe(runner.name, 100)}) has run for {runner.age:.1f} s on "
        f"worker {safe(runner.worker, 100)}, more than --max-running {max_running:g}"
        + (f" (handed back {runner.handbacks} times before)" if runner.handbacks else "")
        for runner in runners[:LONG_RUNNERS_NAMED]
    ]
    if len(runners) > LONG_RUNNERS_NAMED:
        problems.append(f"and more jobs running longer than --max-running {max_running:g}")
    return problems
