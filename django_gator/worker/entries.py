"""The records a worker's slots keep (see :mod:`.slots`): a running job's entry, a
fetcher round's turn, a finished success waiting for its batched mark."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from django_gator.attempts import Success
from django_gator.engines import ClaimedJob


class Idle(Enum):
    """What :meth:`Slots.next_job` returns when its ``until`` came with no job."""

    UNTIL = "until"


#: A plain success waiting for its batched mark: the job, its outcome, its duration (ms).
Finished = tuple[ClaimedJob, Success, float]


@dataclass(slots=True)
class Running:
    job: ClaimedJob
    thread: threading.Thread
    deadline: float | None  # time.monotonic() after which the job has timed out
    started: float = field(default_factory=time.monotonic)  # time.monotonic() at its start
    stall: float | None = None  # its stall_timeout; journal.active_at: its last sign of life
    journal: Any = None

    def stall_deadline(self) -> float | None:
        if self.stall is None or self.journal is None:
            return None
        return float(self.journal.active_at) + self.stall


@dataclass(slots=True)
class Round:
    """What the fetcher does in one turn of its loop (see Slots.next_round)."""

    stopping: bool
    free: int  # executor slots to claim for (0 while a suspect is held or runs alone)
    idle: bool  # nothing was claimed or running when the round began
    suspect: ClaimedJob | None  # a held suspect that may start now, alone
    #: Queues a wakeup named since the last round that claimed (see Claimer.claim).
    woken: frozenset[str] = frozenset()
    #: (queue, job name) of the jobs that ended since the last round (see Claimer.claim).
    freed: frozenset[tuple[str, str]] = frozenset()
