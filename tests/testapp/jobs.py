"""Jobs the test suite dispatches; worker subprocesses find them by autodiscovery."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from django_gator import Queueable, Retry, job
from tests.testapp.models import Execution


class Noop(Queueable):
    def handle(self, *args: Any, **kwargs: Any) -> None:
        return None


class Record(Queueable):
    """Writes one ledger row per run; a second run of the same claim breaks the unique key."""

    def handle(self, label: str = "", sleep: float = 0.0) -> dict[str, Any]:
        if sleep:
            time.sleep(sleep)
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )
        return {"label": label, "attempt": self.attempt}


class RecordOnce(Queueable):
    """Like Record, but a second run of the same job in any attempt fails."""

    def handle(self, label: str = "") -> None:
        Execution.objects.create(job_id=self.job_id, attempt=0, pid=os.getpid(), label=label)


class Echo(Queueable):
    queue = "echo"
    priority = 5

    def handle(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"args": list(args), "kwargs": kwargs, "queue": self.queue}


class Boom(Queueable):
    def handle(self, message: str = "boom") -> None:
        raise RuntimeError(message)


class BoomWithRetry(Queueable):
    retry = Retry(interval=60, max_retries=2, queue="retries")

    def handle(self) -> None:
        raise ValueError(f"attempt {self.attempt} failed")


class ExitsProcess(Queueable):
    def handle(self) -> None:
        sys.exit(3)


class KillsWorker(Queueable):
    """A poison pill: SIGKILLs the worker process that runs it."""

    def handle(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class Sleep(Queueable):
    def handle(self, seconds: float, label: str = "") -> None:
        time.sleep(seconds)
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )


class ReturnsObject(Queueable):
    def handle(self) -> object:
        return object()


@job(queue="functions", priority=3)
def add(a: int, b: int) -> int:
    return a + b


@job
def record_kw(*, label: str) -> None:
    Execution.objects.create(job_id=0, attempt=0, pid=os.getpid(), label=label)


class TooSlow(Queueable):
    """Runs past its timeout in small steps (Python code, so the worker can interrupt it)."""

    timeout = 0.5

    def handle(self, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.02)
        Execution.objects.create(job_id=self.job_id, attempt=self.attempt, pid=os.getpid())


class TooSlowWithRetry(TooSlow):
    retry = Retry(interval=300, max_retries=1)


class ChainStep(Queueable):
    """Chain steps record '<Class>:<order>' in the ledger."""

    def handle(self, order: str) -> str:
        Execution.objects.create(
            job_id=self.job_id,
            attempt=self.attempt,
            pid=os.getpid(),
            label=f"{type(self).__name__}:{order}",
        )
        return type(self).__name__


class FetchData(ChainStep):
    queue = "chains"


class ProcessData(ChainStep):
    """Fails on its first two attempts, then succeeds."""

    queue = "chains"
    retry = Retry(interval=0, max_retries=3)

    def handle(self, order: str) -> str:
        if self.attempt < 3:
            raise ConnectionError(f"flaky attempt {self.attempt}")
        return super().handle(order)


class NotifyUser(ChainStep):
    queue = "chains"


class BrokenStep(ChainStep):
    queue = "chains"

    def handle(self, order: str) -> str:
        raise ValueError(f"cannot process {order}")


class ChainFailed(Queueable):
    queue = "chains"

    def handle(self, chain_id: str, job_id: int) -> None:
        Execution.objects.create(
            job_id=job_id, attempt=0, pid=os.getpid(), label=f"on_error:{chain_id}"
        )


class Spawner(Queueable):
    """Dispatches a job to another queue while it runs."""

    def handle(self, target: str) -> None:
        time.sleep(0.2)  # long enough for an idle fetcher to look for work meanwhile
        Echo.dispatch("spawned", queue=target)
