"""``gator_worker --processes N``: a supervisor process that keeps N worker processes running.

The supervisor holds no database connection and runs no job. It starts each worker as a new
interpreter running the same management command (never a fork of a process that may hold
connections or threads), with ``--supervisor ID`` added, and then only watches:

- a worker that exits or dies is started again, at once if it had got past its start-up,
  else after a backoff (see :mod:`.children`); the log says how it ended (exit code or
  signal);
- a worker whose heartbeat thread has ended no heartbeat round for the heartbeat timeout
  less one interval (frozen by SIGSTOP, wedged in C code, deadlocked) is killed with
  SIGKILL and started again (see :mod:`.beacon` for how the supervisor hears each worker's
  lifeline without a database connection, and what it does not count as silence). Its
  running jobs are taken back by the ordinary rescue once its heartbeat lapses, an
  interval later: it is dead by then, so the rescue runs no job whose worker lives;
- with ``--health-file``, the supervisor keeps the file for all its workers: its
  modification time is the oldest of their last heartbeats (a worker being replaced counts
  from the last heartbeat of the one it replaces), so a probe of its age fails while any
  worker is stuck, as it would for a single worker's file;
- a worker that stopped to recycle (``--max-jobs``, ``--max-memory``) exits with
  ``EXIT_RECYCLED`` and is replaced at once;
- the first SIGINT/SIGTERM is passed on to every worker, as SIGTERM (they stop claiming and
  finish their jobs), a second one too (they hand their jobs back and exit now); the
  supervisor exits 0 once every worker has stopped;
- with ``--burst``, a worker that exits 0 has drained its queues and is not replaced; the
  supervisor exits when every worker has.

Workers run in a process group of their own, so that a Ctrl-C in a terminal reaches the
supervisor alone (which passes it on once), not every worker twice. A worker whose
supervisor was SIGKILLed stops by itself: on Linux the kernel sends it SIGTERM
(``PR_SET_PDEATHSIG``, see :func:`as_child`); everywhere, it stops when it sees that its
parent process changed (:meth:`.limits.Limits.orphaned`).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from secrets import token_hex
from types import FrameType
from typing import Any

from django_gator import conf, health
from django_gator.logutil import safe
from django_gator.worker.beacon import lapsed, stopped
from django_gator.worker.children import EXIT_RECYCLED, Child, child_environment, describe_exit
from django_gator.worker.queues import QueueSpec

logger = logging.getLogger("django_gator.worker")

#: How often the supervisor looks at its workers and at the signals it received (at least
#: twice beacon.SAME_LOOK).
TICK = 0.1
#: Linux prctl(2) option: the signal this process gets when its parent exits.
PR_SET_PDEATHSIG = 1


def supervisor_pid(supervisor_id: str) -> int:
    """The pid in a supervisor id (``host:pid:token``); ValueError if there is none."""
    parts = supervisor_id.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        raise ValueError(f"supervisor id {supervisor_id!r} is not HOST:PID:TOKEN")
    return int(parts[1])


def as_child(supervisor_id: str) -> int:
    """Prepare this process to run as a worker of the supervisor ``supervisor_id``: on
    Linux, ask the kernel for SIGTERM (a graceful stop) when the supervisor exits, however
    it exits. Returns the supervisor's pid, which the worker also watches for (the only
    way elsewhere, and it covers a supervisor that died before the request was made)."""
    pid = supervisor_pid(supervisor_id)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        except (OSError, AttributeError) as exc:
            logger.warning("No parent-death signal; watching the parent pid only error=%s", exc)
    return pid


def child_arguments(
    parser: argparse.ArgumentParser, options: Mapping[str, Any], leave_out: Collection[str]
) -> list[str]:
    """The command line that gives a worker process the options of this one: each option
    of ``parser`` whose value in ``options`` is not its default, except the destinations
    in ``leave_out``. Options are found through the parser, so that a new option of
    ``gator_worker`` reaches the workers without a change here."""
    args: list[str] = []
    for action in parser._actions:
        if not action.option_strings or action.dest in leave_out or action.dest == "help":
            continue
        value = options.get(action.dest, action.default)
        if value is None or value == action.default or action.default == argparse.SUPPRESS:
            continue
        flag = max(action.option_strings, key=len)
        if action.nargs == 0:  # store_true and the like: the flag alone
            if value:
                args.append(flag)
        elif isinstance(value, list | tuple):
            for item in value:
                args += [flag, _text(item)]
        else:
            args += [flag, _text(value)]
    return args


def _text(value: object) -> str:
    if isinstance(value, QueueSpec):
        return f"{value.name},{value.weight}"
    return str(value)


class ProcessSupervisor:
    """Starts ``processes`` workers running ``python -m django gator_worker ARGUMENTS
    --supervisor ID`` and keeps them running; ``run()`` blocks until they have all
    stopped, and returns 0."""

    def __init__(
        self,
        processes: int,
        arguments: Sequence[str],
        *,
        burst: bool = False,
        install_signal_handlers: bool = True,
        on_exit: Callable[[int], None] | None = None,
        health_file: str | None = None,
        databases: Sequence[str] = (),
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be at least 1, got {processes}")
        self.processes = processes
        self.arguments = list(arguments)
        self.burst = burst
        self.install_signal_handlers = install_signal_handlers
        self.on_exit = on_exit  # called with the pid of each worker process that ended
        self.id = f"{socket.gethostname()}:{os.getpid()}:{token_hex(4)}"
        self.health_file = health_file  # kept for every worker (see _keep_health_file)
        self._health_at: float | None = None  # the modification time it was given
        self.heartbeat_timeout = conf.heartbeat_timeout()
        self.heartbeat_interval = conf.heartbeat_interval()
        #: Silence after which a worker is killed: an interval before its heartbeat lapses,
        #: so that it is dead before any other worker may rescue its jobs.
        self.silence_limit = self.heartbeat_timeout - self.heartbeat_interval
        self._last_tick = time.monotonic()
        self._judge_after = 0.0  # no worker killed for silence before this (monotonic)
        now = time.time()
        # With several job databases, ``processes`` workers for each, each given its own.
        homes: list[str | None] = [a for a in databases for _ in range(processes)] or [
            None
        ] * processes
        self.children = [
            Child(index, database=home, last_ok=now) for index, home in enumerate(homes)
        ]
        self.started = 0  # worker processes started, replacements included
        self._signals: list[int] = []  # appended by the handler, acted on by the loop
        self._forwarded = 0
        self._env = child_environment()

    @property
    def stopping(self) -> bool:
        return bool(self._signals)

    def command(self, child: Child, beacon: int) -> list[str]:
        extra = ["--supervisor", self.id, "--beacon", str(beacon), "--skip-checks"]
        if child.database is not None:
            extra += ["--database", child.database]
        if child.index % self.processes > 0 and "--no-scheduler" not in self.arguments:
            extra.append("--no-scheduler")  # one process per database dispatches the schedules
        return [sys.executable, "-m", "django", "gator_worker", *self.arguments, *extra]

    # -- lifecycle ---------------------------------------------------------------------------
    def run(self) -> int:
        previous = self._install_signals() if self.install_signal_handlers else {}
        try:
            logger.info(
                "Supervisor started id=%s processes=%s burst=%s",
                self.id,
                self.processes,
                self.burst,
            )
            for child in self.children:
                self._start(child)
            self._last_tick = time.monotonic()
            while self._live():
                self._forward_signals()
                now = time.monotonic()
                self._note_own_stall(now)
                for child in self.children:
                    self._look_at(child, now)
                self._keep_health_file()
                time.sleep(TICK)
        finally:
            self._stop_leftovers()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        logger.info("Supervisor stopped id=%s started=%s", self.id, self.started)
        return 0

    def _live(self) -> bool:
        """Some worker is running, or due to be started again."""
        return any(
            c.process is not None or (c.restart_at is not None and not self.stopping)
            for c in self.children
        )

    def _start(self, child: Child) -> None:
        process = child.launch(functools.partial(self.command, child), self._env)
        self.started += 1
        logger.info(
            "Started worker process supervisor=%s slot=%s pid=%s database=%s",
            self.id,
            child.index,
            process.pid,
            child.database or "-",
        )

    def _look_at(self, child: Child, now: float) -> None:
        """Hear what ``child``'s process said, kill it if its lifeline went silent, reap it
        if it ended, and start another when one is due."""
        process = child.process
        if process is not None:
            code = process.poll()
            self._listen(child, process.pid)  # after poll: all it wrote, if it ended
            if code is None:
                self._judge(child, process, now)
                return
            child.process = None
            if self.on_exit is not None:
                self.on_exit(process.pid)
            self._ended(child, process.pid, code, now)
            if child.vitals is not None:
                child.vitals.close()
        if child.restart_at is not None and not self.stopping and now >= child.restart_at:
            self._start(child)

    def _listen(self, child: Child, pid: int) -> None:
        vitals = child.vitals
        if vitals is None:
            return
        first, ran = vitals.last_end is None, vitals.ran
        vitals.read()
        if vitals.last_ok is not None:
            child.last_ok = max(child.last_ok, vitals.last_ok)
        if first and vitals.last_end is not None:
            logger.info("Worker process heartbeating pid=%s slot=%s", pid, child.index)
        if vitals.ran and not ran:
            logger.info("Worker process ran its first job pid=%s slot=%s", pid, child.index)

    def _note_own_stall(self, now: float) -> None:
        """After a stall of this loop (the host was frozen or starved, and the workers with
        it), judge no worker's silence for two heartbeat intervals: what they wrote
        meanwhile is read first, and a live one writes again within an interval."""
        gap = now - self._last_tick
        self._last_tick = now
        if gap > self.heartbeat_timeout / 2:
            self._judge_after = now + 2 * self.heartbeat_interval
            logger.warning(
                "Supervisor loop stalled for %.1f s; judging no worker's heartbeat for %.1f s "
                "id=%s",
                gap,
                2 * self.heartbeat_interval,
                self.id,
            )

    def _judge(self, child: Child, process: subprocess.Popen[bytes], now: float) -> None:
        """SIGKILL ``child``'s process if its lifeline has been silent for longer than the
        silence limit, unless it is waiting on the database (see .beacon): not stopped, and
        no other worker's heartbeat was answered since its round began. Its jobs are
        rescued by the ordinary rescue of a lapsed heartbeat.

        While the supervisor stops too: a worker finishing its jobs heartbeats until they
        are done (then says it is leaving), and a frozen one would never end."""
        vitals = child.vitals
        if vitals is None or now < self._judge_after or child.killed_silent is not None:
            return
        others = [c.vitals for c in self.children if c is not child and c.vitals is not None]
        silent = lapsed(vitals, others, process.pid, now, self.silence_limit)
        if silent is None:
            return
        child.killed_silent = silent
        logger.warning(
            "Worker process silent for %.1f s (its heartbeat lapses at %gs): frozen, wedged "
            "or deadlocked%s; killing it pid=%s slot=%s",
            silent,
            self.heartbeat_timeout,
            " (stopped)" if stopped(process.pid) else "",
            process.pid,
            child.index,
        )
        process.kill()

    def _keep_health_file(self) -> None:
        """Give the health file the time of the oldest last heartbeat among the workers, so
        that its age is the age of the stalest worker's heartbeat."""
        if self.health_file is None:
            return
        times = [c.last_ok for c in self.children if not c.finished]
        if not times or min(times) == self._health_at:
            return
        self._health_at = min(times)
        try:
            health.touch(self.health_file, at=self._health_at)
        except OSError as exc:
            logger.warning(
                "Could not touch the health file path=%s error=%s", safe(self.health_file), exc
            )

    def _ended(self, child: Child, pid: int, code: int, now: float) -> None:
        lived = now - child.started_at
        how = describe_exit(code)
        if child.killed_silent is not None:
            how += f" (killed after {child.killed_silent:.1f} s without a heartbeat)"
        if self.stopping:
            log = logger.info if code in (0, -signal.SIGTERM, -signal.SIGINT) else logger.warning
            log("Worker process stopped pid=%s %s", pid, how)
            return
        if code == EXIT_RECYCLED:
            logger.info("Worker process recycled pid=%s; starting another", pid)
            child.failures = 0
            child.restart_at = now
            return
        if code == 0 and self.burst:
            logger.info("Worker process drained its queues pid=%s", pid)
            child.finished = True
            return
        delay = child.restart_after(lived, now)
        logger.warning(
            "Worker process ended pid=%s %s after=%.1fs; starting another in %.1fs "
            "(failures at start-up in a row: %s)",
            pid,
            how,
            lived,
            delay,
            child.failures,
        )

    # -- signals -----------------------------------------------------------------------------
    def _handle_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)  # only noted: the loop passes it on within TICK

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {
            signum: signal.signal(signum, self._handle_signal)
            for signum in (signal.SIGINT, signal.SIGTERM)
        }

    def _forward_signals(self) -> None:
        while self._forwarded < len(self._signals):
            signum = self._signals[self._forwarded]
            self._forwarded += 1
            kind = "graceful" if self._forwarded == 1 else "now"
            logger.info(
                "Supervisor stopping id=%s signal=%s stop=%s",
                self.id,
                signal.Signals(signum).name,
                kind,
            )
            for child in self.children:
                child.restart_at = None
                # Always SIGTERM: a worker counts either signal alike, and one still
                # starting (its handlers not yet installed) ends quietly on SIGTERM,
                # where SIGINT would print a KeyboardInterrupt traceback.
                child.signal(signal.SIGTERM)

    def _stop_leftovers(self) -> None:
        """After an error in the supervisor itself: stop the workers it leaves (they finish
        their jobs), and wait for them. Then close every pipe."""
        alive = [c for c in self.children if c.process is not None and c.process.poll() is None]
        for child in alive:
            child.signal(signal.SIGTERM)
        for child in alive:
            assert child.process is not None
            child.process.wait()
        for child in self.children:
            if child.vitals is not None:
                child.vitals.close()
