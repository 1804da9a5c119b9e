"""The ends a waiting process is told of, on PostgreSQL: one LISTEN connection per
database alias and process, shared by all its ``wait_result()`` / ``await_result()``.

A waiter flags the row it waits for (:meth:`EndWatch.flag_job`, :meth:`EndWatch.flag_run`)
and subscribes a wake callable under its key (``j<job id>`` or ``r<workflow id>``); the
triggers of django_gator/engines/ends.py NOTIFY when a flagged row ends, and the listener
thread calls the callables subscribed under the payload. The thread starts with the first
subscription and closes its connection after :data:`IDLE_CLOSE` seconds with none. On
a lost connection it wakes every waiter (each re-reads and, while :attr:`listening` is
clear, polls as on the other databases), reconnects with a backoff, and wakes them all
again once LISTEN is back (an end that committed while nobody listened was told to
nobody: the re-read sees it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django_gator import conf
from django_gator.engines import JobEngine, get_engine

logger = logging.getLogger("django_gator")

#: Seconds the listener keeps its connection while no waiter is subscribed.
IDLE_CLOSE = 10.0
#: Seconds of each wait for a notification (how often the idle close is considered).
LISTEN_SLICE = 0.5
#: The longest pause between two attempts to reconnect a lost LISTEN connection.
LONGEST_RECONNECT = 5.0

Wake = Callable[[], None]


class EndWatch:
    """The LISTEN of one alias in this process, and the waiters subscribed to it."""

    def __init__(self, engine: JobEngine, listener: JobEngine) -> None:
        self.engine = engine  # where the flags are written
        self.listener = listener  # where LISTEN connects (a direct alias behind a pooler)
        self.lock = threading.Lock()
        self.waiters: dict[str, list[Wake]] = {}
        #: Set while LISTEN is in place: a waiter may then wait for a notification.
        self.listening = threading.Event()
        self.thread: threading.Thread | None = None
        self.idle_since: float | None = None
        self.closing = threading.Event()
        #: Connections opened for LISTEN so far (one unless some were lost).
        self.connections = 0

    def flag_job(self, job_id: int) -> str | None:
        return self.engine.flag_awaited(job_id)

    def flag_run(self, run_id: object) -> None:
        self.engine.flag_awaited_run(run_id)

    def subscribe(self, key: str, wake: Wake) -> None:
        with self.lock:
            self.waiters.setdefault(key, []).append(wake)
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name=f"gator-ends-{self.engine.alias}", daemon=True
                )
                self.thread.start()

    def unsubscribe(self, key: str, wake: Wake) -> None:
        with self.lock:
            wakes = self.waiters.get(key, [])
            if wake in wakes:
                wakes.remove(wake)
            if not wakes:
                self.waiters.pop(key, None)

    def wake(self, keys: set[str] | None = None) -> None:
        """Call the waiters of ``keys`` (every waiter if None)."""
        with self.lock:
            if keys is None:
                wakes = [w for subscribed in self.waiters.values() for w in subscribed]
            else:
                wakes = [w for key in keys for w in self.waiters.get(key, ())]
        for wake in wakes:
            wake()

    def _idle_over(self) -> bool:
        """Whether the thread should end, no waiter having been subscribed for
        IDLE_CLOSE seconds; if so it is forgotten (the next subscription starts another)."""
        with self.lock:
            if self.closing.is_set():
                pass
            elif self.waiters:
                self.idle_since = None
                return False
            else:
                now = time.monotonic()
                if self.idle_since is None:
                    self.idle_since = now
                if now - self.idle_since < IDLE_CLOSE:
                    return False
            self.thread = None
            self.idle_since = None
            self.listening.clear()
            return True

    def _run(self) -> None:
        failures = 0
        while True:
            try:
                with self.listener.listen_ends() as listening:
                    self.connections += 1
                    failures = 0
                    self.listening.set()
                    self.wake()  # ends before LISTEN were told to nobody: re-read
                    while not self._idle_over():
                        keys = listening.wait(LISTEN_SLICE)
                        if keys:
                            self.wake(keys)
                    return
            except Exception:
                self.listening.clear()
                self.wake()  # each waiter reads, then polls until LISTEN is back
                failures += 1
                logger.warning(
                    "LISTEN connection of wait_result() failed; waiters poll until it is "
                    "back alias=%s",
                    self.listener.alias,
                    exc_info=failures == 1,
                )
            if self._idle_over():
                return
            self.closing.wait(min(0.1 * 2**failures, LONGEST_RECONNECT))

    def close(self) -> None:
        """End the listener thread and its connection now (a test's database is then
        free to drop); a later subscription starts another. Its waiters, if any, read
        as on the other databases until then."""
        with self.lock:
            thread = self.thread
        if thread is None:
            return
        self.closing.set()
        self.wake()
        thread.join()
        self.closing.clear()


_watches: dict[str, EndWatch | None] = {}
_watches_lock = threading.Lock()


def watch(alias: str) -> EndWatch | None:
    """The watch of ``alias`` in this process, or None where waiters read instead: a
    database without LISTEN, or one behind a transaction pooler with no direct
    GATOR_LISTEN_DATABASE (LISTEN needs a session of its own)."""
    with _watches_lock:
        if alias not in _watches:
            _watches[alias] = _make(alias)
        return _watches[alias]


def close_all() -> None:
    """Close every listener of this process (:meth:`EndWatch.close`)."""
    with _watches_lock:
        watches = [w for w in _watches.values() if w is not None]
    for each in watches:
        each.close()


def _make(alias: str) -> EndWatch | None:
    engine = get_engine(alias)
    if not engine.can_listen:
        return None
    listener = engine
    if engine.pooled:
        direct = conf.listen_database()
        if direct is None:
            return None
        listener = get_engine(direct)
        if not listener.can_listen or listener.pooled:
            return None
    return EndWatch(engine, listener)
