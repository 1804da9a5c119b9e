"""Jobs whose log records are captured (issue 35, captured logs)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from asgiref.sync import sync_to_async

from django_gator import Queueable, Retry

job_logger = logging.getLogger("tests.jobs")
#: A library the jobs call: its records are captured too.
library_logger = logging.getLogger("tests.library")


def library_call(value: Any) -> None:
    library_logger.info("library saw %s", value)
    library_logger.debug("library detail %s", value)


class LogsTwoAttempts(Queueable):
    """INFO and above; fails on its first attempt after logging, with its password."""

    queue = "logs"
    log_level = "INFO"
    retry = Retry(interval=0, max_retries=1)

    def handle(self, count: int, password: str = "") -> int:
        job_logger.info("attempt %s starts with %s items", self.attempt, count)
        job_logger.debug("a debug line, below the level")
        library_call(f"attempt-{self.attempt}")
        job_logger.warning("the password is %s", password)
        if self.attempt == 1:
            try:
                raise ValueError("first attempt fails")
            except ValueError:
                job_logger.exception("caught and logged")
                raise
        return self.attempt


class LogsMany(Queueable):
    """Logs ``count`` lines of ``size`` characters at DEBUG."""

    queue = "logs"
    log_level = logging.DEBUG

    def handle(self, count: int, size: int = 10) -> int:
        for i in range(count):
            job_logger.debug("line %05d %s", i, "x" * size)
        return count


class LogsConcurrently(Queueable):
    """Logs ``lines`` lines tagged with ``tag``, interleaving with the other threads:
    each waits at a barrier-like rendezvous (every job started) before logging."""

    queue = "logs"
    log_level = "INFO"
    started: dict[str, threading.Event] = {}

    def handle(self, tag: str, lines: int, together: int) -> str:
        LogsConcurrently.arrive(together)
        for i in range(lines):
            job_logger.info("%s line %s", tag, i)
            library_call(tag)
            time.sleep(0)  # deliberate: yield the GIL so the threads' lines interleave
        return tag

    lock = threading.Lock()
    arrived = 0
    all_here = threading.Event()

    @classmethod
    def arrive(cls, together: int) -> None:
        with cls.lock:
            cls.arrived += 1
            if cls.arrived >= together:
                cls.all_here.set()
        cls.all_here.wait(30)


class LogsAsync(Queueable):
    """An async job: logs from its coroutine, a task it awaits and a sync call."""

    queue = "logs"
    log_level = "INFO"
    retry = Retry(interval=0, max_retries=1)

    async def handle(self, tag: str) -> int:
        job_logger.info("%s async starts, attempt %s", tag, self.attempt)
        await asyncio.sleep(0)
        await asyncio.gather(self.sub(tag, 1), self.sub(tag, 2))
        await sync_to_async(library_call)(f"{tag}-sync")
        if self.attempt == 1:
            raise RuntimeError("async fails once")
        return self.attempt

    async def sub(self, tag: str, n: int) -> None:
        await asyncio.sleep(0)
        job_logger.info("%s subtask %s", tag, n)


class LogsBySetting(Queueable):
    """No log_level of its own: GATOR_JOB_LOG_LEVEL decides."""

    queue = "logs"

    def handle(self) -> None:
        job_logger.info("an info line")
        job_logger.warning("a warning line")


class NeverLogs(Queueable):
    """log_level = False: nothing captured, whatever the setting."""

    queue = "logs"
    log_level = False

    def handle(self) -> None:
        job_logger.warning("not captured")


class LogsThenHangs(Queueable):
    """Logs, then runs past its timeout (in Python code the watchdog interrupts)."""

    queue = "logs"
    log_level = "INFO"
    timeout = 0.5

    def handle(self) -> None:
        job_logger.info("before the hang")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.01)


class AtomicLogs(Queueable):
    """Atomic: logs, then fails on its first attempt (its writes roll back; its logs not)."""

    queue = "logs"
    atomic = True
    log_level = "INFO"
    retry = Retry(interval=0, max_retries=1)

    def handle(self) -> int:
        job_logger.info("atomic attempt %s", self.attempt)
        if self.attempt == 1:
            raise RuntimeError("rolled back")
        return self.attempt
