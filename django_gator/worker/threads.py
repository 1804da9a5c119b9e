"""The threads of one worker process: each started by name and kept while it runs (so that
the shutdown can join it), each closing its own database connections as it ends. A thread
that crashes stops the worker."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import connections

from django_gator.exceptions import JobTimeout
from django_gator.worker.slots import Slots

logger = logging.getLogger("django_gator.worker")


class WorkerThreads:
    """The running threads of worker ``worker_id``; ``on_crash`` stops the worker."""

    def __init__(self, slots: Slots, worker_id: str, on_crash: Callable[[], None]) -> None:
        self.slots = slots
        self.worker_id = worker_id
        self.on_crash = on_crash
        # The threads running now (each removes itself as it ends: a long-running worker
        # replaces an executor at every timeout, and kept every one it had replaced).
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
        """Start a thread called ``name`` that runs ``target``."""

        def main() -> None:
            try:
                target()
            except JobTimeout:
                if threading.current_thread() not in self.slots.retired:
                    raise
                # The JobTimeout raised into a timed-out executor arrived after its job
                # had ended; the thread was retiring anyway.
            except BaseException:
                logger.exception("Worker thread crashed thread=%s worker=%s", name, self.worker_id)
                self.on_crash()
            finally:
                try:
                    connections.close_all()  # this thread's connections
                finally:  # even if a late JobTimeout lands in close_all()
                    self._forget(threading.current_thread())

        thread = threading.Thread(target=main, name=name, daemon=True)
        with self._lock:
            self._threads.add(thread)  # before it starts, so that it is there to remove
        try:
            thread.start()
        except BaseException:  # e.g. "can't start new thread": none to join at shutdown
            # Not _forget(): a replacement executor is started under the slots' lock (not
            # reentrant), and a thread that never ran was never among the retired.
            with self._lock:
                self._threads.discard(thread)
            raise
        return thread

    def _forget(self, thread: threading.Thread) -> None:
        """A thread of this worker ends: nothing keeps it."""
        with self._lock:
            self._threads.discard(thread)
        with self.slots.lock:
            self.slots.retired.discard(thread)

    def running(self) -> list[threading.Thread]:
        """The threads running now."""
        with self._lock:
            return list(self._threads)
