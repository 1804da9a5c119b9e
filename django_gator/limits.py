"""Flow-control values: concurrency limits, rate limits (``"100/m"``) and concurrency keys.

A leaf: the job classes, ``GATOR_QUEUES``'s check, the admin's queue form and the limited
claim all read limits through these functions, so a bad value is refused with the same
words everywhere.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

#: Longest concurrency key, as stored in ``django_gator_job.concurrency_key``.
KEY_MAX_LENGTH = 200
#: Longest rate limit text stored on a queue's row.
RATE_MAX_LENGTH = 20
#: Largest concurrency or rate count.
LIMIT_MAX = 1_000_000

#: The unit of a rate limit, in seconds.
UNITS = {"s": 1, "m": 60, "h": 3600}
_RATE_RE = re.compile(r"\s*(\d+)\s*/\s*([smh])\s*")
_BAD_CHARS = re.compile("[\x00\ud800-\udfff]")

#: The options a queue of ``GATOR_QUEUES`` may set.
QUEUE_OPTIONS = ("concurrency", "rate_limit")


class Rate(NamedTuple):
    """At most ``starts`` starts in any window of ``seconds``."""

    starts: int
    seconds: int

    def __str__(self) -> str:
        unit = {v: k for k, v in UNITS.items()}[self.seconds]
        return f"{self.starts}/{unit}"


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_rate(value: object, what: str = "rate_limit") -> Rate | None:
    """``"100/m"`` as a :class:`Rate`; None and ``""`` mean no rate limit. ValueError,
    naming ``what`` and the value, for anything else (``"100 per minute"``, ``"0/s"``)."""
    if value is None or value == "":
        return None
    if isinstance(value, Rate):
        return value
    match = _RATE_RE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(
            f"{what} must be a rate such as \"100/m\" (a count, '/', then s, m or h), "
            f"got {_shown(value)}"
        )
    count = int(match.group(1))
    if not 1 <= count <= LIMIT_MAX:
        raise ValueError(f"{what} must allow from 1 to {LIMIT_MAX} starts, got {_shown(value)}")
    return Rate(count, UNITS[match.group(2)])


def validate_concurrency(value: object, what: str = "concurrency") -> int | None:
    """A concurrency limit: a whole number from 1, or None (no limit)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= LIMIT_MAX:
        raise ValueError(
            f"{what} must be a whole number from 1 to {LIMIT_MAX} (or None), got {_shown(value)}"
        )
    return value


def validate_key(key: object, job_name: str) -> str | None:
    """A ``concurrency_key()`` result: a str of 1 to 200 characters, or None (the job is
    not held to its class's limits)."""
    if key is None:
        return None
    if not isinstance(key, str):
        raise TypeError(
            f"{job_name}.concurrency_key() must return a str or None, got {_shown(key)}"
        )
    if not key or len(key) > KEY_MAX_LENGTH or _BAD_CHARS.search(key):
        raise ValueError(
            f"{job_name}.concurrency_key() returned {_shown(key)}: use 1 to {KEY_MAX_LENGTH} "
            "characters, without NUL or lone surrogates"
        )
    return key


def flow_key(job_class: Any, keyer: Any, args: Any, kwargs: Any) -> str | None:
    """The concurrency key a dispatch of ``job_class`` stores: None for a class without
    limits, ``""`` for a limited class without concurrency_key() (the class is one key),
    else what ``keyer.concurrency_key(*args, **kwargs)`` returns."""
    if not job_class.traits.is_limited:
        return None
    if not job_class.traits.is_keyed:
        return ""
    return validate_key(keyer.concurrency_key(*args, **kwargs), job_class.name)


def queue_options_problem(queue: object, options: object) -> str | None:
    """Why ``GATOR_QUEUES[queue]`` is not allowed, or None. Unknown options are not a
    problem here (see :func:`unknown_queue_options`): a warning names them."""
    if not isinstance(options, dict):
        return f"GATOR_QUEUES[{_shown(queue)}] must be a dict of options, got {_shown(options)}"
    try:
        validate_concurrency(options.get("concurrency"), f"GATOR_QUEUES[{queue!r}]['concurrency']")
        parse_rate(options.get("rate_limit"), f"GATOR_QUEUES[{queue!r}]['rate_limit']")
    except ValueError as exc:
        return str(exc)
    return None


def unknown_queue_options(options: Any) -> list[str]:
    """The keys of one ``GATOR_QUEUES`` entry that are not queue options."""
    if not isinstance(options, dict):
        return []
    return sorted(str(k) for k in options if k not in QUEUE_OPTIONS)
