"""How a ``--processes`` supervisor, which holds no database connection, knows that each of
its worker processes is alive: a pipe per process, written by that process's heartbeat
thread (the *beacon*).

What it tracks: the lifeline (:mod:`.lifeline`), the thread whose heartbeats tell the
whole fleet that this worker lives and keeps its jobs. The lifeline writes one word to the
pipe as it begins a round (``busy``: heartbeat and rescue, all database work) and one as
it ends it (``ok``: the database answered; ``failed``: it raised). So the words stop
exactly when the thing the fleet relies on stops:

- a process stopped by SIGSTOP (or a debugger) writes nothing, whatever it was doing;
- a process wedged in C code that holds the GIL writes nothing: the heartbeat thread
  cannot run either (a job stuck in a pathological regular expression is one);
- a heartbeat thread that is deadlocked (a lock a crashed thread left taken) writes
  nothing, while the other threads may run on.

Silence is counted from the end of the lifeline's last round (its last ``ok`` or
``failed``), and the supervisor kills a process after the heartbeat timeout less one
heartbeat interval of it: when its last round wrote its heartbeat (``ok``, just after the
write), the process is dead before that heartbeat lapses and any other worker may rescue
its jobs.

No other thread writes on the lifeline's behalf: a process whose main thread or
executors still run but whose lifeline has stopped is exactly the one whose jobs the
fleet will take back at ``GATOR_HEARTBEAT_TIMEOUT`` while it may still be running them,
so it must not look alive. (The main thread adds one word, ``ran``, once the process has
run a job to its outcome; it proves that the process got past its start-up, never that
it lives.)

What it does not count as a lapse: a round that has begun and not ended is waiting on the
database (a lock, a server that restarts, a connection cut off: the worker's network
bounds end that wait), and a restart would wait just the same; an outage must not kill
every worker and charge their jobs a crash. Such a process is replaced only if it is
stopped (Linux tells: ``/proc/PID/stat``), or if the database has meanwhile answered
another process's heartbeat (an ``ok`` read after this round began): then the database
works, and the wait is this process's own (wedged before it could say ``ok``, or its
connection alone cut off, when its jobs are being rescued anyway). A stall of the
database, of a lock every heartbeat needs, or of SQLite's one write lock holds every
process's heartbeat alike, and none is replaced for it.

A process is judged from its lifeline's first word on: its start-up (Django's, then
waiting for a database that may be down) is not, and a process that fails there exits by
itself. The supervisor also judges nobody for two heartbeat intervals after its own loop
stalled (the host was frozen or starved: the processes it watches were too), as the
lifeline does after its own heartbeats stalled.

Why a pipe: it needs no file to clean up and no polling of mtimes, it carries words, and
what a process wrote while the supervisor itself was stopped waits in it, to be read
before the supervisor judges. The worker's end is non-blocking: when the pipe is full (a
stopped supervisor) a word is dropped, so the heartbeat thread never waits on the
supervisor; when the supervisor is gone, writing fails quietly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

logger = logging.getLogger("django_gator.worker")

#: The words a worker process writes, one per line.
BUSY = "busy"  # a heartbeat round began (its database work)
OK = "ok"  # it ended, the database answered: the heartbeat is written
FAILED = "failed"  # it ended with an error (the database did not answer)
RAN = "ran"  # the process ran its first job to an outcome
BYE = "bye"  # the heartbeat thread stopped: the process is shutting down
WORDS = frozenset({BUSY, OK, FAILED, RAN, BYE})


class Beacon:
    """A worker process's end of its supervisor's pipe (``fd``; None: no supervisor, and
    :meth:`send` does nothing). Raises ValueError naming ``fd`` when it is not open."""

    def __init__(self, fd: int | None = None) -> None:
        self.fd = fd
        if fd is None:
            return
        try:
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)  # not for the subprocesses a job starts
        except OSError as exc:
            raise ValueError(f"--beacon {fd}: not an open file descriptor ({exc})") from None

    def send(self, word: str) -> None:
        if self.fd is None:
            return
        # Full (the supervisor is stopped) or gone: never wait on it. Shorter than
        # PIPE_BUF, so one write.
        with contextlib.suppress(OSError):
            os.write(self.fd, word.encode() + b"\n")


@dataclass
class Vitals:
    """What the supervisor knows of one worker process from its pipe (``fd``, the read
    end, non-blocking). Times are time.monotonic(), but ``last_ok``, time.time()."""

    fd: int
    #: When the lifeline's last round ended (OK or FAILED; its first BUSY until then):
    #: None before its first word. The main thread's RAN does not count.
    last_end: float | None = None
    round_began: float | None = None  # the last BUSY
    in_round: bool = False  # the last word was BUSY: waiting on the database
    last_ok: float | None = None  # when an OK was last read (time.time())
    last_ok_at: float | None = None  # the same, time.monotonic()
    ran: bool = False  # it ran a job to its outcome
    leaving: bool = False  # BYE: it is shutting down
    _partial: bytes = field(default=b"", repr=False)

    def read(self) -> list[str]:
        """Take what the process wrote since the last call; the words, in order."""
        chunks = []
        while True:
            try:
                chunk = os.read(self.fd, 4096)
            except BlockingIOError:
                break
            except OSError:  # closed
                break
            if not chunk:
                break  # the process ended (every copy of the write end is closed)
            chunks.append(chunk)
        if not chunks:
            return []
        lines = (self._partial + b"".join(chunks)).split(b"\n")
        self._partial = lines.pop()
        now, wall = time.monotonic(), time.time()
        words = []
        for line in lines:
            word = line.decode(errors="replace")
            if word not in WORDS:
                logger.warning("Unknown word from a worker process word=%r", word[:40])
                continue
            words.append(word)
            if word == BUSY:
                self.in_round, self.round_began = True, now
                if self.last_end is None:
                    self.last_end = now
            elif word in (OK, FAILED):
                self.in_round, self.last_end = False, now
                if word == OK:
                    self.last_ok, self.last_ok_at = wall, now
            elif word == RAN:
                self.ran = True
            elif word == BYE:
                self.leaving = True
        return words

    def silent_for(self, now: float) -> float | None:
        """Seconds since the lifeline last ended a round; None before its first word, or
        once it said it is leaving (neither is judged)."""
        if self.last_end is None or self.leaving:
            return None
        return now - self.last_end

    def close(self) -> None:
        """Close the read end (once: its number may be reused)."""
        if self.fd < 0:
            return
        fd, self.fd = self.fd, -1
        os.close(fd)


#: An ``ok`` read less than this after the beginning of another process's round was read
#: in the same look of the supervisor (it looks every 0.1 s), and may have been written
#: before that round began.
SAME_LOOK = 0.05


def lapsed(
    vitals: Vitals, others: Iterable[Vitals], pid: int, now: float, limit: float
) -> float | None:
    """The seconds process ``pid`` (``vitals``) has been silent for if it must be replaced
    (more than ``limit``, and not waiting on the database with the ``others``), else
    None. See the module's docstring for the rule."""
    silent = vitals.silent_for(now)
    if silent is None or silent <= limit:
        return None
    if vitals.in_round and not stopped(pid) and not answered_since(vitals, others):
        return None  # its heartbeat waits on the database: a new process would wait too
    return silent


def answered_since(vitals: Vitals, others: Iterable[Vitals]) -> bool:
    """Whether the database answered another process's heartbeat (an ``ok`` read in a
    later look) after the beginning of the round ``vitals`` is in."""
    began = vitals.round_began
    return began is not None and any(
        other.last_ok_at is not None and other.last_ok_at > began + SAME_LOOK for other in others
    )


def open_pipe() -> tuple[Vitals, int]:
    """A new pipe: the supervisor's :class:`Vitals` on its read end, and the write end's
    fd for the worker process (close it in the supervisor once the process has it)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    return Vitals(read_fd), write_fd


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, a debugger). Linux only: False where
    there is no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")
