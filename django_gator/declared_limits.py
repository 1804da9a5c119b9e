"""The flow control that job classes declare (``concurrency_limit``, ``rate_limit``), by
queue: what the dashboard, ``gator_status`` and ``gator_queue`` show beside a queue's own
limits, so a queue whose jobs are limited per key does not read "none"."""

from __future__ import annotations

from dataclasses import dataclass

from django_gator.registry import registered_jobs


@dataclass(frozen=True)
class JobLimit:
    """A job class's flow control: ``concurrency_limit`` (at most this many running) and
    ``rate_limit`` (starts per window), each counted per concurrency key when the class
    defines ``concurrency_key()`` (``per_key``), else for the class."""

    job: str
    concurrency_limit: int | None
    rate_limit: str
    per_key: bool

    @property
    def text(self) -> str:
        per = " per key" if self.per_key else ""
        parts = []
        if self.concurrency_limit is not None:
            parts.append(f"{self.concurrency_limit} at once{per}")
        if self.rate_limit:
            parts.append(f"{self.rate_limit}{per}")
        return f"{self.job.rsplit('.', 1)[-1]} {', '.join(parts)}"


def job_limits() -> dict[str, list[JobLimit]]:
    """The limits of the registered job classes, by the queue they declare."""
    found: dict[str, list[JobLimit]] = {}
    for name, job_class in sorted(registered_jobs().items()):
        if job_class.traits.is_limited:
            limit = JobLimit(
                name,
                job_class.concurrency_limit,
                str(job_class.rate_limit or ""),
                job_class.traits.is_keyed,
            )
            found.setdefault(job_class.queue, []).append(limit)
    return found
