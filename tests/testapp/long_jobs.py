"""Long-running jobs the tests run: progress, checkpoints, each(), stalls."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from django.db import connections

from django_gator import Queueable, Retry, conf
from tests.testapp.models import ItemDone


def _ledger(job: Queueable, item: int) -> None:
    ItemDone.objects.create(job_id=job.job_id, item=item, attempt=job.attempt, pid=os.getpid())


class CountsItems(Queueable):
    """Walks ``count`` items with each(), one ledger row per item, ``pause`` s apiece;
    fails once at item ``fail_at`` on its first attempt (then is retried at once)."""

    queue = "long"
    retry = Retry(interval=0, max_retries=3)

    def handle(self, count: int, pause: float = 0.0, fail_at: int | None = None) -> int:
        for item in self.each(list(range(count))):
            if fail_at is not None and item == fail_at and self.attempt == 1:
                raise RuntimeError(f"failing at item {item}")
            _ledger(self, item)
            deadline = time.monotonic() + pause
            while time.monotonic() < deadline:  # Python code: interruptible
                time.sleep(min(0.01, pause))
        return count


class CountsRows(Queueable):
    """each() over a queryset (the ledger of job ``source``), recording what it saw."""

    queue = "long"

    def handle(self, source: int) -> list[int]:
        seen = []
        for row in self.each(ItemDone.objects.filter(job_id=source), chunk=7):
            seen.append(row.item)
        return seen


class ManualCheckpoint(Queueable):
    """The contract's example: progress, checkpoint and heartbeat by hand; fails once at
    row ``fail_at``; returns the row it started from."""

    queue = "long"
    retry = Retry(interval=0, max_retries=2)

    def handle(self, count: int, fail_at: int) -> int:
        start = (self.checkpoint_data or {}).get("row", 0)
        for i in range(start, count):
            if i == fail_at and self.attempt == 1:
                raise RuntimeError("boom")
            self.progress(i + 1, total=count, note="importing")
            self.checkpoint({"row": i + 1, "password": "s3cret"})
            self.heartbeat()
        return start


class ProgressStorm(Queueable):
    """Calls progress() ``count`` times in a tight loop; returns how many UPDATEs of the
    jobs table its connection sent meanwhile."""

    queue = "long"

    def handle(self, count: int) -> dict[str, Any]:
        updates = []

        def counting(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            if sql.lstrip().upper().startswith("UPDATE"):
                updates.append(sql)
            return execute(sql, params, many, context)

        started = time.monotonic()
        with connections[conf.database()].execute_wrapper(counting):
            for i in range(count):
                self.progress(i + 1, total=count, note="storm")
        return {"updates": len(updates), "seconds": time.monotonic() - started}


class Stalls(Queueable):
    """Its first attempt reports progress once, then goes quiet (in Python code, which the
    watchdog can interrupt); later attempts finish at once."""

    queue = "long"
    stall_timeout = 0.5
    retry = Retry(interval=0, max_retries=1)

    def handle(self, quiet: float = 30.0) -> int:
        self.progress(1, total=2, note="about to stall")
        if self.attempt == 1:
            deadline = time.monotonic() + quiet
            while time.monotonic() < deadline:
                time.sleep(0.01)
        for _ in range(20):  # busy for a second, but alive
            self.heartbeat()
            time.sleep(0.05)
        return self.attempt


class AsyncStalls(Queueable):
    queue = "long"
    stall_timeout = 0.5
    retry = Retry(interval=0, max_retries=1)

    async def handle(self) -> int:
        self.progress(1, note="async")
        if self.attempt == 1:
            await asyncio.sleep(30)
        for _ in range(10):
            self.heartbeat()
            await asyncio.sleep(0.1)
        return self.attempt


class AsyncCounts(Queueable):
    """each() in an async handler; fails once at ``fail_at``; returns its items."""

    queue = "long"
    retry = Retry(interval=0, max_retries=1)

    async def handle(self, count: int, fail_at: int) -> list[int]:
        seen = []
        for item in self.each(list(range(count))):
            if item == fail_at and self.attempt == 1:
                raise RuntimeError("async boom")
            seen.append(item)
            await asyncio.sleep(0)
        return seen


class AtomicCheckpoint(Queueable):
    """Atomic: checkpoints, then fails on its first attempt (the checkpoint rolls back
    with it); returns the checkpoint its attempt started from."""

    queue = "long"
    atomic = True
    retry = Retry(interval=0, max_retries=1)

    def handle(self) -> Any:
        start = self.checkpoint_data
        self.checkpoint({"attempt": self.attempt})
        if self.attempt == 1:
            raise RuntimeError("rolled back")
        return start


class DiesMidway(Queueable):
    """No retries: its first attempt dies at item ``fail_at``; returns where the attempt
    that succeeded started."""

    queue = "long"

    def handle(self, count: int, fail_at: int) -> int:
        start = (self.checkpoint_data or {}).get("each", 0)
        for item in self.each(list(range(count))):
            if item == fail_at and self.attempt == 1:
                raise RuntimeError("dies")
        return start


class AsyncSlowItems(Queueable):
    """each() in an async handler, ``pause`` s per item; returns where it started."""

    queue = "long"

    async def handle(self, count: int, pause: float) -> int:
        start = (self.checkpoint_data or {}).get("each", 0)
        for _item in self.each(list(range(count))):
            await asyncio.sleep(pause)
        return start
