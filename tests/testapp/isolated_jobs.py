"""Jobs that run in a child process of their own (issue 35, process isolation)."""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Any

from django_gator import Queueable, Retry
from tests.testapp.models import ItemDone

logger = logging.getLogger("tests.isolated")


class Segfaults(Queueable):
    """Reads address 0 through ctypes: SIGSEGV."""

    queue = "isolated"
    isolation = "process"

    def handle(self) -> None:
        ctypes.string_at(0)


class ExitsThree(Queueable):
    """os._exit(3) on its first attempt (no cleanup, no exception); retried once."""

    queue = "isolated"
    isolation = "process"
    retry = Retry(interval=0, max_retries=1)

    def handle(self) -> int:
        if self.attempt == 1:
            os._exit(3)
        return os.getpid()


class EatsMemory(Queueable):
    """Allocates ``mib`` MiB, beyond its memory_limit of 128."""

    queue = "isolated"
    isolation = "process"
    memory_limit = 128

    def handle(self, mib: int) -> int:
        blocks = [bytearray(1024 * 1024) for _ in range(mib)]
        return len(blocks)


class IsolatedWork(Queueable):
    """Reports progress, checkpoints, logs and writes a ledger row per item from its child;
    fails once at ``fail_at``; returns (its pid, where it started)."""

    queue = "isolated"
    isolation = "process"
    log_level = "INFO"
    retry = Retry(interval=0, max_retries=1)

    def handle(self, count: int, fail_at: int | None = None) -> dict[str, Any]:
        start = (self.checkpoint_data or {}).get("each", 0)
        for item in self.each(list(range(count))):
            if item == fail_at and self.attempt == 1:
                raise RuntimeError(f"failing at {item}")
            ItemDone.objects.create(
                job_id=self.job_id, item=item, attempt=self.attempt, pid=os.getpid()
            )
            logger.info("item %s in pid %s", item, os.getpid())
        return {"pid": os.getpid(), "start": start}


class AsyncIsolated(Queueable):
    """An async handler, isolated: awaited in its child."""

    queue = "isolated"
    isolation = "process"

    async def handle(self, value: int) -> dict[str, int]:
        self.progress(1, total=1, note="async child")
        return {"value": value * 2, "pid": os.getpid()}


class Ordinary(Queueable):
    """An ordinary job beside the isolated ones: returns its pid."""

    queue = "isolated"

    def handle(self, n: int) -> int:
        return os.getpid()


class HangsInC(Queueable):
    """Records its pid, then sleeps in C for an hour: only its timeout ends it."""

    queue = "isolated"
    isolation = "process"
    timeout = 1

    def handle(self) -> None:
        import time

        ItemDone.objects.create(job_id=self.job_id, item=0, attempt=self.attempt, pid=os.getpid())
        time.sleep(3600)  # deliberate: a call that never returns


class IsolatedStalls(Queueable):
    """Reports once, then goes quiet in C on its first attempt: its stall_timeout ends it."""

    queue = "isolated"
    isolation = "process"
    stall_timeout = 3.0
    retry = Retry(interval=0, max_retries=1)

    def handle(self) -> int:
        import time

        self.progress(1, total=2, note="about to stall")
        if self.attempt == 1:
            time.sleep(60)  # deliberate: silent, in a call the watchdog cannot interrupt
        return self.attempt


class IsolatedSlowItems(Queueable):
    """each() in a child, ``pause`` s per item; returns where it started."""

    queue = "isolated"
    isolation = "process"

    def handle(self, count: int, pause: float) -> int:
        import time

        start = (self.checkpoint_data or {}).get("each", 0)
        for _item in self.each(list(range(count))):
            time.sleep(pause)  # deliberate: an item's work
        return start


class OddError(Exception):
    """An exception whose __init__ does not take its args back: it cannot be unpickled."""

    def __init__(self, left: int, right: int) -> None:
        super().__init__(f"{left}+{right}")


class RaisesOddError(Queueable):
    queue = "isolated"
    isolation = "process"

    def handle(self) -> None:
        raise OddError(1, 2)


class SpinsForever(Queueable):
    """Burns CPU for ever, isolated, with a cpu_limit of 1 s."""

    queue = "isolated"
    isolation = "process"
    cpu_limit = 1

    def handle(self) -> None:
        while True:
            pass
