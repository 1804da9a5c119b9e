"""One worker slot of a ``--processes`` supervisor (see :mod:`.processes`): the process
in it, how that process is started, how its end is told, and when the next one starts.

A worker that exits or dies is started again: at once if it had got past its start-up (it
ran a job to its outcome, or lived ``START_GRACE`` seconds), else after a pause that
doubles with each failure at start-up in a row (up to ``MAX_BACKOFF``). A worker the OOM
killer takes in the middle of its work is back within a tick, however often that happens;
one that cannot start (a missing migration, a database that refuses it) does not spin.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from django_gator.worker.beacon import Vitals, open_pipe

#: The exit code of a supervised worker that stopped to recycle (sysexits' EX_TEMPFAIL:
#: "start another"). A worker started on its own exits 0 when it recycles.
EXIT_RECYCLED = 75
#: A worker that ends sooner than this many seconds after its start failed at start-up
#: (generous: on a loaded machine, Django's start-up alone has taken 18 s).
START_GRACE = 60.0
#: The first pause before starting again a worker that failed at start-up; it doubles with
#: each failure in a row, up to MAX_BACKOFF.
FIRST_BACKOFF = 0.5
MAX_BACKOFF = 30.0


@dataclass
class Child:
    """One worker slot of the supervisor and the process now in it."""

    index: int
    #: The job database its workers serve (``--database``), when the supervisor serves
    #: several; None: the command's own.
    database: str | None = None
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    failures: int = 0  # start-up failures in a row
    restart_at: float | None = None  # when to start the next process (after a backoff)
    finished: bool = False  # a burst worker that drained its queues: not replaced
    starts: int = 0
    vitals: Vitals | None = None  # what its pipe said (see .beacon)
    #: time.time() of the last heartbeat of a process in this slot (the health file); the
    #: supervisor's start until the first.
    last_ok: float = 0.0
    killed_silent: float | None = None  # seconds of silence it was killed after

    def launch(
        self, command: Callable[[int], list[str]], env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        """Start a process in this slot: ``command(beacon)`` is its command line, given
        the write end of the pipe it reports its heartbeats on."""
        self.restart_at = None
        self.killed_silent = None
        vitals, beacon = open_pipe()
        try:
            process = subprocess.Popen(
                command(beacon),
                env=env,
                stdin=subprocess.DEVNULL,
                process_group=0,  # the terminal's Ctrl-C reaches the supervisor only
                pass_fds=(beacon,),
            )
        except BaseException:
            vitals.close()
            raise
        finally:
            os.close(beacon)  # the worker's now: EOF once it ends
        self.process = process
        self.vitals = vitals
        self.started_at = time.monotonic()
        self.starts += 1
        return process

    def restart_after(self, lived: float, now: float) -> float:
        """Its process ended after ``lived`` seconds: when the next one starts, and the
        pause until then (none if the process got past its start-up)."""
        got_going = self.vitals is not None and self.vitals.ran
        if got_going or lived >= START_GRACE:
            self.failures = 0  # it had started: not a failure at start-up
            delay = 0.0
        else:
            self.failures += 1
            delay = min(FIRST_BACKOFF * 2 ** (self.failures - 1), MAX_BACKOFF)
        self.restart_at = now + delay
        return delay

    def signal(self, signum: int) -> None:
        if self.process is not None:
            self.process.send_signal(signum)  # nothing if it has ended


def child_environment() -> dict[str, str]:
    """This process's environment, with its import path, so that a worker started as
    ``python -m django`` imports the project as this process does (whether it was started
    by ``manage.py``, ``django-admin --pythonpath`` or ``call_command``)."""
    env = dict(os.environ)
    paths = dict.fromkeys(os.path.abspath(p) for p in sys.path if p)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def describe_exit(code: int) -> str:
    """``code=1`` or ``signal=SIGKILL`` (a negative Popen return code)."""
    if code < 0:
        try:
            return f"signal={signal.Signals(-code).name}"
        except ValueError:
            return f"signal={-code}"
    return f"code={code}"
