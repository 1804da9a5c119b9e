"""Which jobs a worker claims next: its queues in weighted order, and where in each
queue's ready index the claim starts.

A :class:`Claimer` is used by the fetcher thread only (it keeps per-queue state without a
lock). One call to :meth:`Claimer.claim` claims up to ``limit`` jobs across the worker's
queues and writes a batch of success marks in the same round trip as the first claim.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from django_gator.engines import ClaimedJob
from django_gator.engines.base import Engine, Keyset
from django_gator.worker.queues import QueueSpec, weighted_order

#: How long the all-queues mode trusts its list of queues with ready work.
QUEUE_LIST_TTL = 2.0
#: Longest run of keyset claims between two full claims, in seconds. A job of higher
#: priority (or one dispatched with an ``at=`` in the past) that arrives while a worker
#: drains a backlog is claimed at the latest after this long.
KEYSET_FULL_EVERY = 0.25

#: A success mark: (job id, attempt, result JSON).
Mark = tuple[int, int, "str | None"]


class Claimer:
    """Claims for one worker: weighted queue order, and keyset claims while a queue drains
    a backlog (each claim starts after the last job the previous one took, instead of
    walking the index from its start past the entries of every job claimed since)."""

    def __init__(
        self,
        engine: Engine,
        worker_id: str,
        specs: Sequence[QueueSpec] = (),
        rng: random.Random | None = None,
    ) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.specs = list(specs)
        self.rng = rng or random.Random()
        self._queue_cache: tuple[float, list[str]] = (0.0, [])
        self._keysets: dict[str, Keyset] = {}  # per queue: the last job claimed
        self._full_claims: dict[str, float] = {}  # per queue: monotonic time of the last

    def claim(self, limit: int, marks: Sequence[Mark] = ()) -> tuple[list[ClaimedJob], list[int]]:
        """Claim up to ``limit`` jobs across the queues, writing the success ``marks`` in
        the same round trip as the first claim (one commit where commits are costly).
        Returns the jobs claimed and the ids whose mark was written."""
        pending = list(marks)
        names = self.queue_order() if limit else []
        if not names:
            written = self.engine.mark_succeeded(self.worker_id, pending) if pending else []
            return [], written
        claimed: list[ClaimedJob] = []
        written = []
        for name in names:
            want = limit - len(claimed)
            hint = self._keyset_hint(name)
            jobs, marked = self.engine.claim_and_mark(
                self.worker_id, name, want, pending, after=hint
            )
            written += marked
            pending = []
            if hint is not None and len(jobs) < want:
                # The backlog after the keyset ran short: a full claim for the rest, which
                # also sees higher priorities and back-dated jobs.
                more, _ = self.engine.claim_and_mark(self.worker_id, name, want - len(jobs), [])
                jobs += more
                hint = None
            self._remember_keyset(name, jobs, full=hint is None, full_batch=len(jobs) >= want)
            claimed += jobs
            if len(claimed) >= limit:
                break
        if not claimed and not self.specs:
            self._queue_cache = (0.0, [])  # look for new queues next time
        return claimed, written

    def queue_order(self) -> list[str]:
        """The queues to claim from, in this round's order."""
        if self.specs:
            return weighted_order(self.specs, self.rng)
        fetched_at, names = self._queue_cache
        if time.monotonic() - fetched_at > QUEUE_LIST_TTL:
            names = self.engine.ready_queues()
            # An empty list is never trusted: a job may be inserted right after.
            self._queue_cache = (time.monotonic() if names else 0.0, names)
        names = list(names)
        self.rng.shuffle(names)
        return names

    def _keyset_hint(self, queue: str) -> Keyset | None:
        """Where to start this queue's claim: after the last job claimed, while the queue
        drains a backlog (the previous claim filled its batch) and a full claim ran within
        KEYSET_FULL_EVERY seconds; None for a full claim."""
        if not self.engine.supports_keyset:
            return None
        keyset = self._keysets.get(queue)
        if keyset is None:
            return None
        if time.monotonic() - self._full_claims.get(queue, 0.0) > KEYSET_FULL_EVERY:
            return None
        return keyset

    def _remember_keyset(
        self, queue: str, jobs: Sequence[ClaimedJob], *, full: bool, full_batch: bool
    ) -> None:
        if not self.engine.supports_keyset:
            return
        if full:
            self._full_claims[queue] = time.monotonic()
        if not jobs or not full_batch:
            self._keysets.pop(queue, None)  # no backlog: the next claim is a full one
            return
        last = max(jobs, key=lambda j: (-j.priority, j.next_execution_at, j.id))
        self._keysets[queue] = (last.priority, last.next_execution_at, last.id)
