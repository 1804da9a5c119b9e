"""Retry policies and backoff, as pure functions of the retry count.

``Retry(interval=300, max_retries=5)`` waits five minutes between attempts;
``Retry(interval="exponential")`` waits ``30 + n**5`` seconds (n = retries so far, from 0)
plus up to 10% random jitter, so a thousand jobs that failed together against a flaky
service do not come back at the same instant. We take the seeds' ``30 + n**5`` over
Sidekiq's ``n**4 + 15``: Sidekiq fires three retries in the first minute, which rarely
outlives the blip that caused them; ours gives 30 s, 31 s, 62 s, 4.5 min, 17.6 min, 53 min,
2.2 h ... and caps a single wait at one week.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from django_gator.validation import validate_queue

EXPONENTIAL: Literal["exponential"] = "exponential"
#: The longest single wait the exponential policy produces, in seconds.
MAX_BACKOFF = 7 * 24 * 3600
#: Jitter added to exponential waits, as a fraction of the base wait.
JITTER = 0.10
#: Retries allowed when a policy does not say.
DEFAULT_MAX_RETRIES = 10

Interval = int | float | Literal["exponential"]


def exponential_base(retry_count: int) -> float:
    """The wait before retry number ``retry_count + 1``, without jitter."""
    if retry_count < 0:
        raise ValueError(f"retry_count must be >= 0, got {retry_count!r}")
    # Past n = 20 the formula is beyond the cap anyway; avoid huge integers.
    return float(min(30 + min(retry_count, 20) ** 5, MAX_BACKOFF))


def exponential_backoff(retry_count: int, rng: random.Random | None = None) -> float:
    """``30 + n**5`` seconds plus up to 10% jitter, capped at :data:`MAX_BACKOFF`."""
    base = exponential_base(retry_count)
    jitter = (rng or random).uniform(0, base * JITTER)
    return min(base + jitter, MAX_BACKOFF)


def validate_interval(interval: object) -> Interval:
    if interval == EXPONENTIAL:
        return EXPONENTIAL
    if isinstance(interval, bool) or not isinstance(interval, int | float):
        raise ValueError(
            f"retry interval must be a number of seconds or 'exponential', got {interval!r}"
        )
    if not interval >= 0 or interval == float("inf"):
        raise ValueError(f"retry interval must be a finite number >= 0, got {interval!r}")
    return interval


@dataclass(frozen=True)
class Retry:
    """A job's retry policy.

    ``interval``: seconds between attempts, or ``"exponential"``.
    ``max_retries``: retries after the first attempt; ``None`` retries forever.
    ``queue``: move the job to this queue for its retries.
    """

    interval: Interval = EXPONENTIAL
    max_retries: int | None = DEFAULT_MAX_RETRIES
    queue: str | None = None

    def __post_init__(self) -> None:
        validate_interval(self.interval)
        if self.max_retries is not None and (
            isinstance(self.max_retries, bool)
            or not isinstance(self.max_retries, int)
            or self.max_retries < 0
        ):
            raise ValueError(f"max_retries must be an int >= 0 or None, got {self.max_retries!r}")
        if self.queue is not None:
            validate_queue(self.queue)

    def allows(self, retry_count: int) -> bool:
        """Whether a job that has already been retried ``retry_count`` times may retry again."""
        return self.max_retries is None or retry_count < self.max_retries

    def delay(self, retry_count: int, interval: Interval | None = None) -> float:
        return delay_for(self.interval if interval is None else interval, retry_count)


def delay_for(interval: Interval, retry_count: int) -> float:
    interval = validate_interval(interval)
    if interval == EXPONENTIAL:
        return exponential_backoff(retry_count)
    return float(interval)
