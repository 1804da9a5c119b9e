"""Which claim serves a queue: the ordinary one, the limited one (engines/flow.py), or both.

The :class:`FlowRouter` keeps two sets: the queues with limits on their row, read again
every LIMITS_TTL seconds (only the limited claim serves them: the ordinary claim's pause
probe refuses them anyway, so a stale set delays a newly limited queue's jobs by up to that
long, never breaks a limit), and the queues that hold ready jobs of limited classes (served
by both), read every ROUTES_TTL seconds, and only while this worker knows a limited class
(a keyed job of a class it does not know as limited is not one it could run within its
limits). A queue in neither set costs nothing more than before; an idle worker of a project
without limits sends one such read per LIMITS_TTL.

A limited claim that found nothing is not repeated for LIMITED_BACKOFF seconds: a queue
whose jobs wait for a slot or a rate window is looked at a few times a second, not at
every round of a busy fetcher. A slot this worker frees ends that rest (see
:meth:`FlowRouter.slot_freed`): the claim found the slots taken, and one is free now.

The first refresh also writes ``GATOR_QUEUES`` into the queue rows it seeds (see
``QueueQuerySet.sync_settings``): every worker start applies the settings.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence

from django_gator import conf
from django_gator.attempts import Mark
from django_gator.engines import ClaimedJob, JobEngine
from django_gator.engines.flow import ClassLimits, FlowClaims
from django_gator.exceptions import JobNotRegistered
from django_gator.limits import parse_rate
from django_gator.models import Queue
from django_gator.registry import get_job_class, registered_jobs

logger = logging.getLogger("django_gator.worker")

#: Seconds between two reads of the queues with limits on their row.
LIMITS_TTL = 5.0
#: Seconds between two reads of the queues holding ready jobs of limited classes.
ROUTES_TTL = 1.0
#: Seconds a queue's limited claim rests after one that found nothing.
LIMITED_BACKOFF = 0.2


def class_limits(name: str) -> ClassLimits | None:
    """The limits of the job class registered as ``name`` (None: none, or unknown)."""
    try:
        job_class = get_job_class(name)
    except JobNotRegistered:
        return None
    if not job_class.traits.is_limited:
        return None
    return ClassLimits(job_class.concurrency_limit, parse_rate(job_class.rate_limit))


class FlowRouter:
    """Routes each queue's claim; used by the fetcher thread only (no lock)."""

    def __init__(
        self, engine: JobEngine, worker_id: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.flow = FlowClaims(engine)
        self.engine = engine
        self.worker_id = worker_id
        self.clock = clock
        self._read_at: float | None = None
        self._limits_read_at: float | None = None
        self.limited: set[str] = set()
        self.keyed: set[str] = set()
        self._rest_until: dict[str, float] = {}
        self._policies: dict[str, ClassLimits | None] = {}

    def refresh(self, *, force: bool = False) -> None:
        now = self.clock()
        if not force and self._read_at is not None and now - self._read_at < ROUTES_TTL:
            return
        if self._limits_read_at is None:
            changed = Queue.objects.using(self.engine.alias).sync_settings(conf.queues())
            if changed:
                logger.info("Queue limits from GATOR_QUEUES written queues=%s", ",".join(changed))
        if self._limits_read_at is None or now - self._limits_read_at >= LIMITS_TTL:
            self.limited = self.flow.limited_queues()
            self._limits_read_at = now
        if any(job_class.traits.is_limited for job_class in registered_jobs().values()):
            self.keyed = self.flow.keyed_queues()
        else:
            self.keyed = set()
        self._read_at = now

    def queues(self) -> set[str]:
        """Queues the limited claim serves (for the all-queues mode's list)."""
        self.refresh()
        return self.limited | self.keyed

    def route(self, queue: str) -> tuple[bool, bool]:
        """(ordinary claim, limited claim) for ``queue`` this round. A queue resting after
        an empty limited claim gets no limited claim (see :meth:`resting`)."""
        self.refresh()
        limited = queue in self.limited
        wanted = (limited or queue in self.keyed) and not self.resting(queue)
        return not limited, wanted

    def resting(self, queue: str) -> bool:
        """Whether ``queue``'s last limited claim found nothing less than LIMITED_BACKOFF
        ago. The Claimer still claims a resting queue in a round that found nothing else,
        so an idle (or burst) worker never mistakes a rest for an empty queue."""
        return self.clock() < self._rest_until.get(queue, 0.0)

    def slot_freed(self, queue: str, name: str) -> None:
        """A job of class ``name`` in ``queue`` ended in this worker. If it held a slot of
        a limit (its queue is limited, or its class), the queue's limited claim resting after
        it found nothing is made again at the next round: it found the slots taken, and this
        one is free now. Otherwise, under load, each slot a job freed stayed empty for what
        was left of the rest, up to LIMITED_BACKOFF: in the hour at 1,200 jobs/s a queue
        limited to 3 jobs at once, of 50-240 ms each, fell behind though offered 70 % of
        what its limit allows (2026-11-28)."""
        if queue in self._rest_until and (queue in self.limited or self.policy(name) is not None):
            del self._rest_until[queue]

    def claim(
        self, queue: str, limit: int, marks: Sequence[Mark] = ()
    ) -> tuple[list[ClaimedJob], list[int]]:
        """The limited claim of ``queue``, writing the success ``marks`` in its
        transaction; (jobs, ids whose mark was written)."""
        jobs, written = self.flow.claim(
            self.worker_id,
            queue,
            limit,
            self.policy,
            keyed=queue in self.keyed,
            limited=queue in self.limited,
            marks=marks,
        )
        if jobs:
            self._rest_until.pop(queue, None)
        else:
            self._rest_until[queue] = self.clock() + LIMITED_BACKOFF
        return jobs, written

    def held_back(self, queues: Collection[str] | None) -> bool:
        """Whether a due job of ``queues`` (None: any queue) waits for a limit that will
        let it run: a slot held by a running job (which ends, or is rescued) or a rate
        window (which passes). Jobs of paused queues are not counted (only an operator
        brings them back), nor those of a queue whose rate_limit cannot be read. Read
        after a round that claimed nothing, so every due job it finds is held back."""
        self.refresh(force=True)
        served = self.limited | self.keyed
        names = served if queues is None else served & set(queues)
        return bool(names) and self.flow.held_back(names, self.limited)

    def policy(self, name: str) -> ClassLimits | None:
        if name not in self._policies:
            self._policies[name] = class_limits(name)
        return self._policies[name]
