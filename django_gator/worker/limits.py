"""When a worker process should end by itself: recycling (``--max-jobs``, ``--max-memory``)
and the loss of the ``--processes`` supervisor that started it.

Recycling does not interrupt anything: the worker stops claiming, runs every job it has
claimed to its outcome, and exits; a supervisor then starts a fresh process (a worker on its
own simply exits, for its process manager to restart). The claim budget in
:class:`~.slots.Slots` makes ``--max-jobs`` exact: the worker never claims more than that.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable

#: Seconds between two looks at the process's memory.
MEMORY_CHECK_INTERVAL = 1.0
MIB = 1024 * 1024


def rss_bytes(pid: int | None = None) -> int:
    """The resident set size of process ``pid`` (default: this one), in bytes.

    Linux: the current value from ``/proc``. Elsewhere, for this process only: the peak
    (``ru_maxrss``), which never goes down, so a limit crossed stays crossed."""
    path = f"/proc/{pid or 'self'}/statm"
    try:
        with open(path) as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        if pid is not None and pid != os.getpid():
            return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class Limits:
    """One worker's recycling limits and the supervisor it must not outlive.

    ``max_jobs``: jobs to claim before recycling; ``max_memory_mb``: resident memory, in
    MiB, past which the worker recycles; ``supervisor_pid``: the parent process that
    started this worker (``--processes``): when it is gone, the worker stops."""

    def __init__(
        self,
        *,
        max_jobs: int | None = None,
        max_memory_mb: int | None = None,
        supervisor_pid: int | None = None,
        memory: Callable[[], int] = rss_bytes,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_jobs = max_jobs
        self.max_memory_mb = max_memory_mb
        self.supervisor_pid = supervisor_pid
        self.memory = memory
        self.clock = clock
        self._next_memory_check = 0.0

    @property
    def active(self) -> bool:
        """Whether there is anything to watch."""
        return (
            self.max_jobs is not None
            or self.max_memory_mb is not None
            or self.supervisor_pid is not None
        )

    def orphaned(self) -> bool:
        """The supervisor that started this worker has exited (this process was handed
        to another parent). Linux also sends SIGTERM then (see ``processes.as_child``)."""
        return self.supervisor_pid is not None and os.getppid() != self.supervisor_pid

    def over_memory(self) -> str | None:
        """``max-memory`` with the figures when the process is past its memory limit (looked
        at once a second at most), else None."""
        if self.max_memory_mb is None:
            return None
        now = self.clock()
        if now < self._next_memory_check:
            return None
        self._next_memory_check = now + MEMORY_CHECK_INTERVAL
        rss = self.memory()
        if rss <= self.max_memory_mb * MIB:
            return None
        return f"max-memory rss={rss / MIB:.0f}MiB limit={self.max_memory_mb}MiB"
