"""Which jobs a worker claims next: its queues in weighted order, and where in each
queue's ready index the claim starts.

A :class:`Claimer` is used by the fetcher thread only (it keeps per-queue state without a
lock). One call to :meth:`Claimer.claim` claims up to ``limit`` jobs across the worker's
queues and writes a batch of success marks in the same round trip as the first claim.

Keyset claims (engines with ``supports_keyset``: PostgreSQL). Claiming a job leaves a dead
entry at the start of its queue's ready index, which PostgreSQL removes only once no open
transaction can still see the row; while a long transaction (a report, a backup) is open,
none is removed, and a claim that reads the index from its start steps over every job
claimed since that transaction began. So the Claimer remembers, per queue and priority, the
last job it claimed (a :class:`~django_gator.engines.base.Position`), and each claim reads
every priority from there: its cost depends on the jobs it takes, not on the worker's age.
What a position could hide, and when it is found:

- a job of a priority the worker has not claimed before: read from the start of its
  priority's range by every claim (found by the next claim);
- a job committed after a later job was claimed (a dispatch whose transaction was still
  open, a retry, a rescue, an admin's "run now"): each priority is read from no later than
  KEYSET_LOOKBACK seconds before now, so one committed within that long of its INSERT is
  found by the next claim;
- a job placed before a position by more than that (dispatched with an ``at=`` in the past,
  released by a stopping worker, a dispatch that committed later still, a row changed by
  hand): found by the next full claim, which reads the queue from the start of its index at
  least every FULL_CLAIM_EVERY seconds. That full claim is the only read whose cost grows
  with the dead entries, once per FULL_CLAIM_EVERY instead of once per claim.

A keyset claim is a heavier statement than a full one (a scan per priority and per gap
between priorities, where the full claim has one), and on a clean index (no long
transaction holding dead entries) it costs more than it saves: about 0.2 to 0.4 ms more per
claim on the benchmark machine. So each queue's claims use the plan measured cheaper: the
Claimer keeps the newest durations of each kind of claim per queue, uses keyset claims
while the shortest recent full claim took more than KEYSET_MARGIN times as long as the
shortest recent keyset claim (see keyset_pays), and goes on measuring full claims at
least every FULL_CLAIM_EVERY seconds (the full claims that bound the delay of back-dated
jobs) and keyset claims at least KEYSET_SAMPLES times in that long.

A queue that holds jobs of limited classes is served by both claims (worker/flow.py), each
claiming what the other left: the ordinary claim first, and the limited one first when none
of its limited claims was made in the last LIMITED_TURN seconds; after the ordinary claim,
the limited one is made only then too (or in a round that found nothing else): at most one
limited claim per LIMITED_TURN seconds per queue and worker, each under the queue row's
lock that serializes every worker's limited claims of the queue. The round's success marks
go with the ordinary claim when it is made (on PostgreSQL in its statement), else with the
limited one (in its single round trip): marks sent with a limited claim wait for the queue
row's lock it takes. While such a queue is busy with limited jobs only, its ordinary claim
would find nothing every round: after one that did, it rests PLAIN_REST seconds (a round
that finds nothing else still makes it).

In the all-queues mode the queues the worker has claimed from are claimed from every round
(a keyset claim of an empty queue is one index descent per priority), and the search for
other queues with work jumps over them (see ``JobEngine.ready_queues``).
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from django_gator.attempts import Mark
from django_gator.engines import ClaimedJob, JobEngine
from django_gator.engines.core import Position
from django_gator.worker.flow import FlowRouter
from django_gator.worker.queues import QueueSpec, weighted_order

#: How long the all-queues mode trusts its list of queues with ready work.
QUEUE_LIST_TTL = 2.0
#: After a round that claimed nothing, the all-queues mode looks for new queues again at
#: the next round, but not sooner than this after its last look: a busy worker's rounds
#: that find nothing (woken for jobs it has claimed already) come many times a second.
QUEUE_LIST_RECHECK = 0.5
#: Keyset engines: longest time between two full claims of a queue (from the start of its
#: ready index), in seconds: the bound on the delay of a job placed more than
#: KEYSET_LOOKBACK before the worker's position in its queue (see the module docstring).
FULL_CLAIM_EVERY = 10.0
#: Keyset engines: each priority is read from no later than this many seconds before the
#: database's now. A job committed within this long of its INSERT is not missed however
#: the worker's position moved meanwhile; a keyset claim steps over the entries of the
#: jobs claimed in the last KEYSET_LOOKBACK seconds, never more.
KEYSET_LOOKBACK = 1.0

#: Keyset engines: keyset claims are used while full claims of the queue take more than
#: this many times as long as keyset claims (the shortest of each kind's recent durations).
KEYSET_MARGIN = 1.2
#: The durations of each kind of claim kept per queue (the newest), and how many fresh ones
#: of the keyset kind the choice needs (fewer: keyset claims are made, to measure them).
COST_SAMPLES = 5
KEYSET_SAMPLES = 3
#: Seconds the ordinary claim of a queue that also holds jobs of limited classes rests
#: after it found nothing while the limited claim was made: in a queue busy with limited
#: jobs, each round would otherwise spend a statement finding no unlimited one. A job
#: without limits dispatched there meanwhile waits at most this long (or until a round
#: finds nothing else).
PLAIN_REST = 0.05
#: In a queue served by both claims, the least time between two of a worker's limited
#: claims, except in a round that found nothing else: each takes the queue row's lock. When
#: it has passed, the limited claim goes first (see Claimer._limited_turn).
LIMITED_TURN = 0.1


@dataclass
class _Round:
    """One call of :meth:`Claimer.claim`: what it still wants, and what it has done."""

    limit: int
    pending: list[Mark]  # success marks not yet written
    claimed: list[ClaimedJob] = field(default_factory=list)
    written: list[int] = field(default_factory=list)  # ids whose mark was written
    rested: list[str] = field(default_factory=list)  # limited claims resting
    plain_rested: list[str] = field(default_factory=list)  # ordinary claims resting
    turn_waiting: list[str] = field(default_factory=list)  # limited claims not yet due

    def want(self) -> int:
        return self.limit - len(self.claimed)


class Claimer:
    """Claims for one worker: weighted queue order, and keyset claims that start where the
    previous claim of each queue and priority stopped (see the module docstring)."""

    def __init__(
        self,
        engine: JobEngine,
        worker_id: str,
        specs: Sequence[QueueSpec] = (),
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        keyset: bool | None = None,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``keyset``: None chooses between keyset and full claims by their measured cost
        (``timer`` measures them); True uses keyset claims whenever a position allows."""
        self.engine = engine
        self.worker_id = worker_id
        self.specs = list(specs)
        self.rng = rng or random.Random()
        self.clock = clock
        #: clock() of the last search for queues with work (None: look at the next round)
        #: and the queues it found.
        self._queue_cache: tuple[float | None, list[str]] = (None, [])
        self._look_again = False  # a round found nothing: look soon (QUEUE_LIST_RECHECK)
        #: Per queue, per priority: (next_execution_at, id) of the last job claimed.
        self._positions: dict[str, dict[int, tuple[Any, int]]] = {}
        self._full_claims: dict[str, float] = {}  # per queue: clock() of the last
        self.keyset = keyset
        self.timer = timer
        #: Per queue, per kind (keyset or full): (clock(), seconds) of its newest claims.
        self._samples: dict[str, dict[bool, deque[tuple[float, float]]]] = {}
        #: Queues with limits, or with jobs of limited classes: the limited claim.
        self.flow = FlowRouter(engine, worker_id, clock)
        #: Per queue served by both claims: until when (clock()) its ordinary claim rests.
        self._plain_rest: dict[str, float] = {}
        #: Per queue served by both claims: when (clock()) its limited claim next goes first.
        self._limited_turns: dict[str, float] = {}
        #: Queues whose last claim took as many jobs as it asked for: they may have more.
        self._full: set[str] = set()

    def claim(
        self,
        limit: int,
        marks: Sequence[Mark] = (),
        woken: Collection[str] = (),
        freed: Collection[tuple[str, str]] = (),
    ) -> tuple[list[ClaimedJob], list[int]]:
        """Claim up to ``limit`` jobs across the queues, writing the success ``marks`` in
        the same round trip as the first claim (one commit where commits are costly).
        Returns the jobs claimed and the ids whose mark was written.

        ``woken``: queues a wakeup named since the last claim. Those not known to have a
        backlog (their last claim took fewer jobs than it asked for, or none was made) are
        claimed first, in their weighted order: their new job would otherwise wait behind
        a backlog elsewhere until the order put its queue first (a job on an idle "emails"
        queue while the worker drains "reports"). A queue whose last claim was filled keeps
        its place in the weighted order, so a busy queue gains nothing from its wakeups.

        ``freed``: (queue, job name) of the jobs that ended in this worker since the last
        claim: a limited claim resting after it found every slot taken is made again."""
        for queue, name in freed:
            self.flow.slot_freed(queue, name)
        pending = list(marks)
        names = self._round_order(limit, woken)
        if not names:
            written = self.engine.mark_succeeded(self.worker_id, pending) if pending else []
            return [], written
        round_ = _Round(limit, pending)
        for name in names:
            self._claim_queue(round_, name)
            if len(round_.claimed) >= limit:
                break
        if not round_.claimed:
            self._claim_resting(round_)
        if round_.pending:
            round_.written += self.engine.mark_succeeded(self.worker_id, round_.pending)
        if not round_.claimed and not self.specs:
            self._look_again = True  # look for new queues soon
        return round_.claimed, round_.written

    def _round_order(self, limit: int, woken: Collection[str]) -> list[str]:
        """The queues this round claims from, in order: the weighted order, with the woken
        queues not known to have a backlog first (see :meth:`claim`)."""
        names = self.queue_order() if limit else []
        if woken and limit and not self.specs:
            # All queues: a queue named by a wakeup has work, listed or not (the list of
            # queues with work is read every QUEUE_LIST_TTL seconds).
            names += sorted(set(woken).difference(names))
        if woken and names:
            first = [name for name in names if name in woken and name not in self._full]
            if first:
                names = first + [name for name in names if name not in first]
        return names

    def _claim_queue(self, round_: _Round, name: str) -> None:
        """Claim what the round still wants from queue ``name``: the ordinary claim (unless
        it rests) and the limited one, each for what the other left (in a queue served by
        both, the limited one first every LIMITED_TURN seconds); note the claims resting."""
        want = round_.want()
        ordinary, limited = self.flow.route(name)
        if not limited and self.flow.resting(name):
            round_.rested.append(name)
        if ordinary and limited and self.clock() < self._plain_rest.get(name, 0.0):
            ordinary = False
            round_.plain_rested.append(name)
        jobs: list[ClaimedJob] = []
        limited_first = ordinary and limited and self._limited_turn(name)
        if limited_first:
            # Not with the marks, which would wait for the queue row's lock: the ordinary
            # claim writes them, or the round's end.
            jobs = self._limited(round_, name, want, with_marks=False)
        if ordinary and len(jobs) < want:
            more, marked = self._ordinary(name, want - len(jobs), round_.pending)
            round_.written += marked
            round_.pending = []
            if limited and not more:
                self._plain_rest[name] = self.clock() + PLAIN_REST
            else:
                self._plain_rest.pop(name, None)
            jobs = jobs + more
        if limited and not limited_first and len(jobs) < want:
            if not ordinary or self._limited_turn(name):
                jobs = jobs + self._limited(round_, name, want - len(jobs))
            else:
                round_.turn_waiting.append(name)
        round_.claimed += jobs
        if len(jobs) < want:
            self._full.discard(name)
        else:
            self._full.add(name)

    def _limited_turn(self, name: str) -> bool:
        """Whether the limited claim goes first this round in ``name``, a queue served by
        both claims: when none of its limited claims was made in the last LIMITED_TURN
        seconds (one made after a short ordinary claim counts too, so a queue whose
        ordinary claims come back short pays no more of them). With the ordinary claim
        always first, a queue busy with jobs without limits filled every round before the limited
        claim was made, and its limited jobs ran far below their limits (at 1,200 jobs/s
        in the soak, 15 a second of the 38 offered, which their limits allowed). With the
        two taking turns round by round, every other round paid a limited claim (a
        transaction under the queue row's lock, serializing the fetchers) and the soak
        finished a fifth fewer jobs."""
        return self.clock() >= self._limited_turns.get(name, 0.0)

    def _limited(
        self, round_: _Round, name: str, want: int, *, with_marks: bool = True
    ) -> list[ClaimedJob]:
        """The limited claim of ``name`` for ``want`` jobs, with the round's marks not
        written yet (on PostgreSQL in its round trip), unless not ``with_marks``."""
        self._limited_turns[name] = self.clock() + LIMITED_TURN
        jobs, marked = self.flow.claim(name, want, round_.pending if with_marks else [])
        round_.written += marked
        if with_marks:
            round_.pending = []
        return jobs

    def _claim_resting(self, round_: _Round) -> None:
        """A round that found nothing: the claims resting after they found nothing are
        made too (a slot may have freed since, a job come), so that an idle or burst
        worker never takes a rest for an empty queue."""
        for name in round_.plain_rested:
            if round_.want() > 0:
                jobs, marked = self._ordinary(name, round_.want(), round_.pending)
                round_.written += marked
                round_.pending = []
                round_.claimed += jobs
        for name in round_.rested + round_.turn_waiting:
            if round_.want() > 0:
                round_.claimed += self._limited(round_, name, round_.want())

    def held_back(self) -> bool:
        """Whether a due job of this worker's queues waits for a limit that will let it
        run (see FlowRouter.held_back), or is held by another transaction's row lock (its
        claim skipped it, or it was just inserted and the claim missed it): a burst worker
        waits for it instead of exiting."""
        names = [s.name for s in self.specs] if self.specs else None
        return self.flow.held_back(names) or self.engine.has_due_jobs(names)

    def _ordinary(
        self, name: str, want: int, marks: Sequence[Mark]
    ) -> tuple[list[ClaimedJob], list[int]]:
        """The ordinary claim of queue ``name``, writing ``marks``; its keyset positions
        and its cost are kept."""
        after = self.position(name)
        started = self.timer()
        jobs, marked = self.engine.claim_and_mark(self.worker_id, name, want, marks, after=after)
        self._measure(name, keyset=after is not None, seconds=self.timer() - started)
        self._advance(name, jobs, full=after is None, full_batch=len(jobs) >= want)
        return jobs, marked

    def queue_order(self) -> list[str]:
        """The queues to claim from, in this round's order."""
        if self.specs:
            return weighted_order(self.specs, self.rng)
        known = sorted(self._positions)
        fetched_at, names = self._queue_cache
        age = math.inf if fetched_at is None else self.clock() - fetched_at
        if age > QUEUE_LIST_TTL or (self._look_again and age >= QUEUE_LIST_RECHECK):
            names = self.engine.ready_queues(known)
            # Only queues not known yet are listed, so with known queues an empty list is
            # the usual answer, kept like any other (a wakeup naming a queue adds it to
            # the round). Without known queues an empty list is never trusted: a job may
            # be inserted right after.
            self._queue_cache = (self.clock() if names or known else None, names)
            self._look_again = False
        names = sorted({*names, *known, *self.flow.queues()})
        self.rng.shuffle(names)
        return names

    def position(self, queue: str) -> Position | None:
        """Where this queue's next claim starts: the positions of its priorities, or None
        for a full claim (the first one, then one at least every FULL_CLAIM_EVERY)."""
        if not self.engine.supports_keyset:
            return None
        positions = self._positions.get(queue)
        if positions is None or self.clock() - self._full_claims[queue] > FULL_CLAIM_EVERY:
            return None
        if self.keyset is None and not self.keyset_pays(queue):
            return None
        return Position(dict(positions), KEYSET_LOOKBACK)

    def keyset_pays(self, queue: str) -> bool:
        """Whether keyset claims of ``queue`` are cheaper than full ones, as measured: the
        least of each kind's durations of the last FULL_CLAIM_EVERY seconds (the newest
        COST_SAMPLES). A duration is what the fetcher thread waited for, the statement
        and then the GIL, which a busy worker's executor threads hold for milliseconds at
        a time: a noise that only ever adds, so the least of several is the claim's own
        cost. (A moving average refreshed by a single keyset claim every FULL_CLAIM_EVERY
        kept a worker of 48 threads on full claims for seconds at a time, each stepping
        over every entry a long transaction kept dead: issue 32 item 5.) With fewer than
        KEYSET_SAMPLES fresh keyset durations, keyset claims are made to measure them: a
        figure that is never refreshed could keep the worker on full claims for ever, such
        as a first keyset claim slowed by its statement's planning while dead entries
        then pile up in front of the full ones."""
        keyset = self._fresh(queue, keyset=True)
        if len(keyset) < KEYSET_SAMPLES:
            return True
        full = self._fresh(queue, keyset=False)
        return not full or min(full) > KEYSET_MARGIN * min(keyset)

    def _fresh(self, queue: str, *, keyset: bool) -> list[float]:
        """The durations of ``queue``'s claims of that kind in the last FULL_CLAIM_EVERY."""
        since = self.clock() - FULL_CLAIM_EVERY
        samples = self._samples.get(queue, {}).get(keyset, ())
        return [seconds for at, seconds in samples if at >= since]

    def _measure(self, queue: str, *, keyset: bool, seconds: float) -> None:
        """Keep a claim's duration among its kind's newest."""
        kinds = self._samples.setdefault(queue, {})
        if keyset not in kinds:
            kinds[keyset] = deque(maxlen=COST_SAMPLES)
        kinds[keyset].append((self.clock(), seconds))

    def _advance(
        self, queue: str, jobs: Sequence[ClaimedJob], *, full: bool, full_batch: bool
    ) -> None:
        """Move the queue's positions past the jobs just claimed. The lowest priority of a
        full batch may have more jobs right after its last one: its position is that job,
        even if it lies before the old position (a full claim found a back-dated job)."""
        if not self.engine.supports_keyset:
            return
        if full:
            self._full_claims[queue] = self.clock()
        positions = self._positions.setdefault(queue, {})
        if not jobs:
            return
        lowest = min(job.priority for job in jobs)
        for job in sorted(jobs, key=lambda j: (j.next_execution_at, j.id)):
            key = (job.next_execution_at, job.id)
            old = positions.get(job.priority)
            if old is None or key > old or (full_batch and job.priority == lowest):
                positions[job.priority] = key
