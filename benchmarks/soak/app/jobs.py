"""The soak's job mix (found by the workers' autodiscovery of ``jobs`` modules).

Every job is in the queue ``soak``; the harness chooses the mix (``--mix``).
"""

from __future__ import annotations

import time

from django_gator import Queueable, Retry

QUEUE = "soak"


class SoakOk(Queueable):
    """The common case: a short job that succeeds."""

    name = "soak.ok"
    queue = QUEUE

    def handle(self, ms: float = 0.0) -> None:
        if ms:
            time.sleep(ms / 1000)


class SoakRetry(Queueable):
    """Fails its first ``fails`` attempts, then succeeds: retried after 5 s."""

    name = "soak.retry"
    queue = QUEUE
    retry = Retry(interval=5, max_retries=3)

    def handle(self, fails: int = 1) -> None:
        if self.attempt <= fails:
            raise RuntimeError(f"soak: attempt {self.attempt} of {fails} failing attempts")


class SoakDead(Queueable):
    """Always fails: two retries 2 s apart, then dead."""

    name = "soak.dead"
    queue = QUEUE
    retry = Retry(interval=2, max_retries=2)

    def handle(self) -> None:
        raise ValueError("soak: this job always fails")


class SoakTimeout(Queueable):
    """Runs past its 1 s timeout (Python code, so the worker's JobTimeout interrupts it);
    no retry, so it ends dead with JobTimeout."""

    name = "soak.timeout"
    queue = QUEUE
    timeout = 1

    def handle(self, seconds: float = 5.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.05)


class SoakSlow(Queueable):
    """A slow job that succeeds (I/O wait, as a call to another service would be)."""

    name = "soak.slow"
    queue = QUEUE

    def handle(self, ms: float = 1000.0) -> None:
        time.sleep(ms / 1000)


#: Mix names (``--mix ok=95,retry=3,...``) and the job class of each.
KINDS: dict[str, type[Queueable]] = {
    "ok": SoakOk,
    "retry": SoakRetry,
    "dead": SoakDead,
    "timeout": SoakTimeout,
    "slow": SoakSlow,
}
