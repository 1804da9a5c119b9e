"""Jobs that ended, counted per minute and queue by the workers that ran them: what the
dashboard's hour chart and the queue figures' ``succeeded_last_hour`` / ``dead_last_hour``
read.

Counting the jobs table's rows that ended in the last hour reads every one of them: at
1,200 jobs a second, four million index entries for each look at the dashboard, however
the rows are indexed or partitioned. So each worker counts the outcomes it writes in
memory (a :class:`Tally`, one dict update per job) and, at each heartbeat, adds one row
per minute and queue it counted to ``django_gator_finished_tally`` (Sidekiq keeps its
processed and failed counts the same way). A reader sums the rows of the last hour: at
most workers x heartbeats a minute x queues rows a minute, whatever the rate.

What is counted: each attempt whose outcome a worker (or an inline run: ``GATOR_IMMEDIATE``,
``run_jobs()``) wrote as succeeded or dead, in the minute of the worker's clock it was
written in. Not counted: jobs a rescue ends dead (their worker died), jobs an operator
ends. A worker killed outright loses what it counted since its last heartbeat (at most
``GATOR_HEARTBEAT_INTERVAL`` seconds of its jobs), and a worker stopped normally writes
its last counts as it stops. Rows older than :data:`KEPT_SECONDS` are deleted by the
workers as they write theirs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from django_gator.states import JobState

#: Seconds the tally rows are kept: the dashboard reads the last hour.
KEPT_SECONDS = 2 * 3600
#: Seconds between two deletions of old rows by one worker.
PRUNE_EVERY = 600.0
#: What each state a written outcome left counts as: (succeeded, dead). A plain success
#: left to the batched mark ("deferred") counts when it is recorded.
_COUNTED = {JobState.SUCCEEDED.value: 0, "deferred": 0, JobState.DEAD.value: 1}

Counts = dict[tuple[int, str], list[int]]


def minute_of(minute: int) -> datetime:
    """The aware UTC datetime of minute number ``minute`` (seconds since the epoch // 60)."""
    return datetime.fromtimestamp(minute * 60, UTC)


class Tally:
    """Outcomes counted in memory by minute and queue until :meth:`flush` writes them.
    Thread-safe: executor threads add, the heartbeat thread flushes."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: Counts = {}

    def add(self, queue: str, state: str | None) -> None:
        """Count an outcome of a job of ``queue`` that left its row in ``state`` (what
        ``Outcomes.record`` returns); states other than succeeded and dead are not
        counted."""
        index = _COUNTED.get(state) if state is not None else None
        if index is None:
            return
        key = (int(self._clock() // 60), queue)
        with self._lock:
            counts = self._counts.get(key)
            if counts is None:
                counts = self._counts[key] = [0, 0]
            counts[index] += 1

    def pending(self) -> Counts:
        """A copy of what was counted and not yet written."""
        with self._lock:
            return {key: list(counts) for key, counts in self._counts.items()}

    def _take(self) -> Counts:
        with self._lock:
            taken, self._counts = self._counts, {}
        return taken

    def _put_back(self, taken: Counts) -> None:
        """Count again what a failed flush took, but what is older than KEPT_SECONDS (a
        worker whose writes keep failing keeps a bounded tally)."""
        oldest = int(self._clock() // 60) - KEPT_SECONDS // 60
        with self._lock:
            for key, (succeeded, dead) in taken.items():
                if key[0] < oldest:
                    continue
                counts = self._counts.setdefault(key, [0, 0])
                counts[0] += succeeded
                counts[1] += dead

    def flush(self, alias: str) -> int:
        """Write what was counted since the last flush to database ``alias``, one row per
        minute and queue (one INSERT), and, at most every PRUNE_EVERY seconds, delete the
        rows older than KEPT_SECONDS. Returns the rows written. If the INSERT fails, the
        counts are kept for the next flush and the error is raised."""
        from django_gator.models import FinishedTally

        taken = self._take()
        if taken:
            rows = [
                FinishedTally(minute=minute_of(minute), queue=queue, succeeded=s, dead=d)
                for (minute, queue), (s, d) in sorted(taken.items())
            ]
            try:
                FinishedTally.objects.using(alias).bulk_create(rows)
            except BaseException:
                self._put_back(taken)
                raise
        now = time.monotonic()
        last = _pruned_at.get(alias)
        if last is None or now - last >= PRUNE_EVERY:
            _pruned_at[alias] = now
            cutoff = minute_of(int(self._clock() // 60)) - timedelta(seconds=KEPT_SECONDS)
            FinishedTally.objects.using(alias).filter(minute__lt=cutoff).delete()
        return len(taken)


#: Per database alias: time.monotonic() of this process's last deletion of old rows (one
#: per process, whatever the number of tallies: an inline run makes one per job).
_pruned_at: dict[str, float] = {}


def finished_since(alias: str, since: datetime) -> list[tuple[datetime, str, int, int]]:
    """(minute, queue, succeeded, dead) summed over the tally rows of ``alias`` from the
    minute of ``since`` on, in no particular order."""
    from django.db.models import Sum

    from django_gator.models import FinishedTally

    start = since.replace(second=0, microsecond=0)
    rows = (
        FinishedTally.objects.using(alias)
        .filter(minute__gte=start)
        .values("minute", "queue")
        .annotate(s=Sum("succeeded"), d=Sum("dead"))
        .order_by()
    )
    return [(row["minute"], row["queue"], row["s"] or 0, row["d"] or 0) for row in rows]
