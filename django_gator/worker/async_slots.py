"""The async jobs' share of a worker's slots (see :class:`AsyncSlots`); part of
:class:`~django_gator.worker.slots.Slots`, guarded by its lock."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from django_gator.engines import ClaimedJob


class AsyncSlots:
    """The async jobs a worker runs on its event loop (see :mod:`.aio`), part of Slots.

    A claim cannot ask for async jobs only: which kind a row is shows once it is claimed.
    So a worker claims for its free executor threads plus a *window* of its free async
    slots. The window grows (doubling, up to ``concurrency``) while claims bring async jobs
    and no sync job has to wait for a thread, and halves when sync jobs overflow the
    threads: a worker whose queues hold only sync jobs claims at most one job more than it
    has threads, and one with async work reaches its full async concurrency in a few
    claims. An async job claimed when no async slot is free waits for one (it takes an
    executor slot meanwhile, so that claims stop)."""

    __slots__ = ("concurrency", "running", "runs_async", "started", "waiting", "window")

    def __init__(self, concurrency: int, runs_async: Callable[[ClaimedJob], bool] | None) -> None:
        self.concurrency = concurrency if runs_async is not None else 0
        self.runs_async = runs_async
        self.window = 1 if self.concurrency else 0
        self.running: dict[int, ClaimedJob] = {}  # by id() of the claimed job
        self.started: list[ClaimedJob] = []  # handed to the loop by the last hand-out
        self.waiting: deque[ClaimedJob] = deque()  # claimed, waiting for an async slot

    def free(self) -> int:
        return max(min(self.concurrency - len(self.running), self.window), 0)

    def take(self, jobs: Sequence[ClaimedJob], threads_free: int) -> list[ClaimedJob]:
        """Take the async jobs among those just claimed (``threads_free``: executor slots
        left once all of ``jobs`` count); returns the others, for the threads."""
        others: list[ClaimedJob] = []
        started: list[ClaimedJob] = []
        runs_async = self.runs_async
        assert runs_async is not None
        for job in jobs:
            if job.suspect or not runs_async(job):
                others.append(job)
            elif len(self.running) < self.concurrency:
                self.running[id(job)] = job
                started.append(job)
                threads_free += 1
            else:
                self.waiting.append(job)
        if threads_free < 0:  # sync jobs wait for a thread: claim fewer for async slots
            self.window //= 2
        elif started:
            self.window = min(max(self.window * 2, 1), self.concurrency)
        self.started = started
        return others

    def take_started(self) -> list[ClaimedJob]:
        """The async jobs of the last hand-out, for the loop (lock held)."""
        started, self.started = self.started, []
        return started
