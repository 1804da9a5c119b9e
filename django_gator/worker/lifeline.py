"""The lifeline: this worker's heartbeats, and the rescue of jobs whose worker died.

Every ``GATOR_HEARTBEAT_INTERVAL`` seconds the worker refreshes its row. A worker whose
row has not been refreshed for ``GATOR_HEARTBEAT_TIMEOUT`` seconds is lost, and any live
worker takes back the jobs it was running: back to ``waiting`` as suspects (see
:mod:`.slots` for precise blame), or to ``dead`` when a job has now crashed its worker
``GATOR_MAX_RESCUES`` times while running alone.

Two things keep a rescue from running a job twice while its worker lives. After this
worker's own heartbeats stalled (a frozen process, a stalled database), it judges nobody
for two heartbeat intervals: the others were most likely stalled by the same thing. And
where all workers share one host (SQLite), the operating system is asked first (see
:mod:`.liveness`): a worker whose process is alive keeps its jobs.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import close_old_connections

from django_gator import conf, health
from django_gator.engines import JobEngine
from django_gator.engines.fairness import fair_upkeep
from django_gator.exceptions import WorkerLost
from django_gator.expiry import settle_expired
from django_gator.logutil import safe
from django_gator.rows import LostClaim
from django_gator.states import JobState
from django_gator.tallies import Tally
from django_gator.worker.beacon import BUSY, BYE, FAILED, OK, Beacon
from django_gator.worker.errors import error_entry
from django_gator.worker.liveness import Liveness, local_worker
from django_gator.worker.retrier import drop_connection

logger = logging.getLogger("django_gator.worker")

#: Seconds between two rescue passes that also look for running jobs whose owner has no
#: worker row at all (a scan of every running entry; the other passes look by owner).
ORPHAN_SWEEP_EVERY = 60.0
#: Seconds between two rounds of the fair queues' upkeep (engines/fairness.py).
FAIR_UPKEEP_EVERY = 60.0
#: Seconds between two log records of failed writes of the finished jobs' tally.
TALLY_LOG_EVERY = 60.0


class Lifeline:
    """Heartbeats and rescue for worker ``worker_id`` (:meth:`run` is the heartbeat
    thread's body; :meth:`rescue` can be called on its own)."""

    def __init__(
        self,
        engine: JobEngine,
        worker_id: str,
        register: Callable[[], object] = lambda: None,
        beacon: Beacon | None = None,
        *,
        tally: Tally | None = None,
    ) -> None:
        self.engine = engine
        #: The worker's outcomes counted per minute, written at each beat (see flush_tally).
        self.tally = tally
        self.worker_id = worker_id
        self.register = register  # writes this worker's row again
        # Each round's begin and end, to the --processes supervisor (see .beacon).
        self.beacon = beacon or Beacon()
        self.last_beat = time.monotonic()  # when our last heartbeat was written
        self._judge_after = 0.0  # no rescues before this time.monotonic() (see may_rescue)
        self._last_sweep = -ORPHAN_SWEEP_EVERY  # the first rescue pass sweeps
        self._spared: set[str] = set()  # lapsed workers found alive on this host (logged)
        self._last_fair_upkeep = -FAIR_UPKEEP_EVERY
        self._tally_logged = -TALLY_LOG_EVERY

    def run(self, stopped: Callable[[float], bool]) -> None:
        """Beat until ``stopped(interval)`` (which waits up to ``interval``) is true."""
        interval = conf.heartbeat_interval()
        self._round(self._first_rescue, "Rescue failed")
        self._round(self.expire, "Expiry sweep failed")  # what expired while no worker ran
        self.last_beat = time.monotonic()
        while not stopped(interval):
            self._round(self.beat, "Heartbeat failed")
        # A sweep skips rows another transaction holds (a claim walking past an expired
        # row locks it for an instant): once more as the worker stops, so that a --burst
        # worker leaves nothing expired behind waiting.
        self._round(self.expire, "Expiry sweep failed")
        self.flush_tally()  # what the last jobs counted (the executors have stopped)
        self.beacon.send(BYE)

    def _first_rescue(self) -> None:
        """The rescue of a worker that died just before we started, on a bookkeeping
        session as every later round (see JobEngine.prepare_bookkeeping)."""
        self.engine.prepare_bookkeeping()
        self.rescue()

    def _round(self, work: Callable[[], object], failure: str) -> None:
        """One round of database work, its begin and end told to the supervisor."""
        self.beacon.send(BUSY)
        try:
            work()
        except Exception:
            logger.exception("%s worker=%s", failure, self.worker_id)
            drop_connection(self.engine.alias)
            self.beacon.send(FAILED)
        else:
            self.beacon.send(OK)

    def beat(self) -> None:
        """One heartbeat, and a rescue pass if this worker may judge others."""
        close_old_connections()
        self.engine.prepare_bookkeeping()
        if not self.engine.heartbeat(self.worker_id):
            logger.warning(
                "Worker row was gone (declared lost by another worker); registering again id=%s",
                self.worker_id,
            )
            self.register()
        health.beat()
        judging = self.may_rescue(time.monotonic())
        if judging or self.engine.workers_share_a_host:
            self.rescue(judging=judging)
        self.expire()
        self.fair_upkeep()
        self.flush_tally()

    def flush_tally(self) -> None:
        """Write the outcomes counted since the last beat (django_gator.tallies). A
        failure is logged (at most once a minute) and the counts kept for the next beat;
        it never counts as a failed heartbeat."""
        if self.tally is None:
            return
        try:
            self.tally.flush(self.engine.alias)
        except Exception:
            now = time.monotonic()
            if now - self._tally_logged >= TALLY_LOG_EVERY:  # e.g. migration 0028 not run
                self._tally_logged = now
                logger.exception("Writing the jobs' tally failed worker=%s", self.worker_id)
            drop_connection(self.engine.alias)

    def fair_upkeep(self) -> None:
        """At most once a minute, and only with fair queues: stamp their unstamped ready
        rows and prune their counters (see engines/fairness.py). A failure is logged and
        tried again at a later beat, as the expiry sweep's."""
        now = time.monotonic()
        if not conf.fairness() or now - self._last_fair_upkeep < FAIR_UPKEEP_EVERY:
            return
        self._last_fair_upkeep = now
        try:
            fair_upkeep(self.engine)
        except Exception:
            logger.exception("Fair queues' upkeep failed worker=%s", self.worker_id)
            drop_connection(self.engine.alias)

    def expire(self) -> None:
        """Settle a bounded batch of jobs past their expiry (no claim takes them anyway:
        this only ends them, see :mod:`django_gator.expiry`). A failed sweep is logged and
        tried again at the next beat; it never counts as a failed heartbeat."""
        try:
            settle_expired(self.engine.alias)
        except Exception:
            logger.exception("Expiry sweep failed worker=%s", self.worker_id)
            drop_connection(self.engine.alias)

    def may_rescue(self, now: float) -> bool:
        """Note a heartbeat written at ``now`` (time.monotonic()); whether this worker may
        now judge others lost.

        When our own heartbeats stopped for a while (this process was frozen, or the
        database was down, or locked by a stalled writer), the other workers were most
        likely stopped by the same thing, and their heartbeats look lapsed although they
        are alive. They get two heartbeat intervals to write one before we rescue anything:
        a job whose worker is alive must not be run twice. (Where the host can tell, as on
        SQLite, a worker whose process is gone or stopped gets no such time: see rescue.)"""
        gap = now - self.last_beat
        self.last_beat = now
        if gap > conf.heartbeat_timeout() / 2:
            wait = 2 * conf.heartbeat_interval()
            self._judge_after = now + wait
            logger.warning(
                "No heartbeat for %.1f s (frozen, or the database stalled); rescuing no "
                "other worker's jobs for %.1f s%s worker=%s",
                gap,
                wait,
                " but those of gone or stopped processes on this host"
                if self.engine.workers_share_a_host
                else "",
                self.worker_id,
            )
        return now >= self._judge_after

    def rescue(self, *, judging: bool = True) -> None:
        """Take back the running jobs of workers whose heartbeat lapsed (every
        ORPHAN_SWEEP_EVERY seconds also those of owners that have no worker row).

        Where all workers share this host (SQLite), the operating system is asked first
        (see worker.liveness): a worker whose process is alive keeps its jobs, its late
        heartbeat most likely waiting for the write lock; one whose process is gone or
        stopped loses them even while we are not ``judging`` (see may_rescue)."""
        cutoff = self.engine.db_now() - timedelta(seconds=conf.heartbeat_timeout())
        max_rescues = conf.max_rescues()
        verdicts = self._ask_the_host(cutoff)
        if not judging and not {Liveness.GONE, Liveness.STOPPED} & set(verdicts.values()):
            return
        sweep = judging and time.monotonic() - self._last_sweep >= ORPHAN_SWEEP_EVERY
        lost = self.engine.lost_claims(cutoff, sweep=sweep)
        if sweep:
            self._last_sweep = time.monotonic()
        for claim in lost:
            verdict = verdicts.get(claim.owner or "", Liveness.UNKNOWN)
            if verdict is Liveness.ALIVE or (not judging and verdict is Liveness.UNKNOWN):
                continue
            self._take_back(claim, cutoff, verdict, max_rescues)
        if judging:
            self._forget_lapsed(cutoff, verdicts)

    def _take_back(
        self, claim: LostClaim, cutoff: datetime, verdict: Liveness, max_rescues: int
    ) -> None:
        """Rescue one lost claim: back to ``waiting`` as a suspect, or ``dead`` when it has
        now crashed its worker ``max_rescues`` times while running alone."""
        owner = claim.owner or ""
        dead = claim.isolated and claim.crashes + 1 >= max_rescues
        reason = _rescue_reason(claim, owner, dead, max_rescues)
        if verdict is not Liveness.UNKNOWN:
            reason += f" (its process on this host is {verdict.value})"
        error, summary = error_entry(
            WorkerLost(reason), attempt=claim.attempts, worker_id=owner, tb=""
        )
        # A rescue can end the job (dead, cancelled): a workflow step's dependents are
        # settled in its transaction.
        rescue = functools.partial(
            self.engine.rescue, claim, cutoff, dead=dead, error=error, last_error=summary
        )
        if self.engine.with_steps([claim.id], None, rescue):
            logger.warning(
                "Rescued job id=%s from lost worker=%s result=%s isolated=%s",
                claim.id,
                safe(owner),
                (JobState.DEAD if dead else JobState.WAITING).value,
                "yes" if claim.isolated else "no",
            )

    def _forget_lapsed(self, cutoff: datetime, verdicts: dict[str, Liveness]) -> None:
        """Remove the rows of the workers judged lost: every lapsed one, or where workers
        share this host, those judged here."""
        if not self.engine.workers_share_a_host:
            self.engine.forget_workers(cutoff)
            return
        # Only the rows judged here: a live worker's row stays (a write spared, too).
        judged = [owner for owner, verdict in verdicts.items() if verdict is not Liveness.ALIVE]
        if judged:
            self.engine.forget_workers(cutoff, only=judged)

    def _ask_the_host(self, cutoff: datetime) -> dict[str, Liveness]:
        """Where all workers share this host: what the operating system says of each worker
        whose heartbeat lapsed before ``cutoff`` (empty elsewhere)."""
        if not self.engine.workers_share_a_host:
            return {}
        shared_memory = self.engine.shared_memory_file()
        verdicts = {}
        for owner, hostname, pid, started_at in self.engine.lapsed_workers(cutoff):
            if owner == self.worker_id:
                verdicts[owner] = Liveness.ALIVE  # we are; our heartbeat waited
                continue
            verdicts[owner] = local_worker(hostname, pid, started_at, shared_memory)
            if verdicts[owner] is Liveness.ALIVE and owner not in self._spared:
                self._spared.add(owner)
                logger.warning(
                    "Worker's heartbeat lapsed, but its process on this host is alive: its "
                    "jobs stay with it id=%s pid=%s worker=%s",
                    safe(owner),
                    pid,
                    self.worker_id,
                )
        return verdicts


def _rescue_reason(claim: LostClaim, owner: str, dead: bool, max_rescues: int) -> str:
    """What the rescued attempt's error entry says happened."""
    if not claim.isolated:
        return (
            f"worker {owner} stopped heartbeating while running this job; the job is "
            "now a suspect, and its next attempts run with no other job beside them, "
            "so that a crash is blamed only on the job that caused it"
        )
    reason = (
        f"worker {owner} stopped heartbeating while this job ran alone in it "
        f"(crash {claim.crashes + 1} of {max_rescues} allowed)"
    )
    if dead:
        reason += "; it crashes its worker, so it is a likely poison pill"
    return reason
