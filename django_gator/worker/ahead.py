"""Claiming ahead: while a worker's jobs run for less time than a claim takes, it claims
for its executor slots before they are free, so no executor waits for the claim's round
trip.

Without it, a worker claims only for free slots: an executor that finishes a job waits for
the fetcher's next claim (a round trip, about a millisecond) before it runs another, and
with jobs shorter than that the executors spend most of the time waiting (a no-op drain of
16 threads: the fetcher spent half its samples waiting for slots, the executors most of
theirs waiting for the fetcher). With a claim ahead the next jobs are already in the
worker when a slot frees, and the claim of the ones after them overlaps their run.

The cost is the wait of the jobs claimed ahead: each waits for a slot of this worker rather
than for another worker's claim. So the allowance (as many jobs as the worker has threads)
is given only while

- the jobs' measured run time (a moving average over every job the executors finish or the
  watchdog takes) is shorter than the measured claim round trip, and
- no job running now has been running that long (a long job that just started is not yet
  in the average).

A job claimed ahead then waits about as long as a claim takes, which is what it would have
waited without it. Jobs claimed ahead are ``pending`` in the worker's slots: a stop gives
them back uncharged, as it gives back every claimed job that did not start.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

#: Weight of the newest run time in the moving average.
WEIGHT = 0.2


class _Started(Protocol):
    started: float  # time.monotonic() at the job's start


class ClaimAhead:
    """The claim-ahead allowance of one worker (read and updated under its slots' lock)."""

    __slots__ = ("concurrency", "run_seconds", "window")

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        #: The fetcher's moving average of a claim's round trip (seconds): jobs that run
        #: shorter than this are claimed ahead. 0 until a claim was measured.
        self.window = 0.0
        #: Moving average of the jobs' run time (seconds); None until a job ended.
        self.run_seconds: float | None = None

    def ran(self, seconds: float) -> None:
        """A job ended after ``seconds`` (or was taken from its thread then)."""
        old = self.run_seconds
        self.run_seconds = seconds if old is None else old + WEIGHT * (seconds - old)

    def allowance(self, running: Iterable[_Started], now: float) -> int:
        """Jobs to claim beyond the free slots now: the concurrency while jobs are shorter
        than a claim, else 0."""
        window = self.window
        if self.run_seconds is None or self.run_seconds >= window:
            return 0
        oldest = now - window
        for entry in running:
            if entry.started <= oldest:
                return 0  # a job that may be long: its slot is not about to free
        return self.concurrency
