"""Weighted fair share between tenants: the values (``fairness_key()``'s keys, the weights of
``GATOR_FAIRNESS``) and the stamp arithmetic. See docs/fairness.md.

A leaf, like :mod:`django_gator.limits`: the job classes, the system check (E013), the
engines that stamp jobs at dispatch and order the claim of a fair queue read them here, so a
bad value is refused with the same words everywhere.

Each job of a fair queue carries a stamp (``fair_order``): its tenant's previous stamp or the
queue's virtual time, whichever is later, plus ``1 / weight``. The claim of a fair queue takes
jobs by (priority, stamp, id), so tenants with waiting work are served in proportion to their
weights, however many jobs each has queued.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Longest fairness key, as stored in ``django_gator_job.fairness_key``.
KEY_MAX_LENGTH = 200
#: The key the jobs of a fair queue share when their class has no ``fairness_key()`` (or it
#: returned None): together they are one tenant of weight 1 (unless weighted).
DEFAULT_KEY = ""
#: The options an entry of ``GATOR_FAIRNESS`` may set.
OPTIONS = ("weights",)
#: Largest weight: a tenant's share against a weight-1 tenant.
WEIGHT_MAX = 1_000_000


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validate_key(key: object, job_name: str) -> str | None:
    """A ``fairness_key()`` result: a str of 1 to 200 characters, or None (the job joins
    the queue's keyless tenant)."""
    if key is None:
        return None
    if not isinstance(key, str):
        raise TypeError(f"{job_name}.fairness_key() must return a str or None, got {_shown(key)}")
    if not key or len(key) > KEY_MAX_LENGTH or "\x00" in key or _lone_surrogate(key):
        raise ValueError(
            f"{job_name}.fairness_key() returned {_shown(key)}: use 1 to {KEY_MAX_LENGTH} "
            "characters, without NUL or lone surrogates"
        )
    return key


def _lone_surrogate(text: str) -> bool:
    return any("\ud800" <= char <= "\udfff" for char in text)


def table_problem(table: object) -> str | None:
    """Why ``GATOR_FAIRNESS`` is not allowed (the system check E013), or None."""
    if not isinstance(table, Mapping):
        return f"GATOR_FAIRNESS must be a dict of queue names to options, got {_shown(table)}"
    for queue, options in table.items():
        where = f"GATOR_FAIRNESS[{_shown(queue)}]"
        if not isinstance(queue, str) or not queue:
            return f"GATOR_FAIRNESS must have queue names as keys, got {_shown(queue)}"
        if not isinstance(options, Mapping):
            return f"{where} must be a dict of options (such as weights), got {_shown(options)}"
        unknown = sorted(str(k) for k in options if k not in OPTIONS)
        if unknown:
            return f"{where} has the unknown option {unknown[0]!r} (options: {', '.join(OPTIONS)})"
        weights = options.get("weights", {})
        if not isinstance(weights, Mapping):
            return f"{where}['weights'] must be a dict of fairness keys to weights, got " + _shown(
                weights
            )
        for key, weight in weights.items():
            if not isinstance(key, str) or len(key) > KEY_MAX_LENGTH:
                return f"{where}['weights'] has a key that is not a fairness key: {_shown(key)}"
            if not _positive(weight):
                return (
                    f"{where}['weights'][{_shown(key)}] must be a number above 0 and at most "
                    f"{WEIGHT_MAX}, got {_shown(weight)}"
                )
    return None


def _positive(weight: object) -> bool:
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        return False
    return 0 < weight <= WEIGHT_MAX


def weights_of(table: Mapping[str, Any], queue: str) -> Mapping[str, float]:
    """The weights declared for ``queue``'s keys (an empty dict: every key weighs 1). A bad
    table raises ValueError with the words of E013."""
    problem = table_problem(table)
    if problem is not None:
        raise ValueError(problem)
    weights: Mapping[str, float] = table[queue].get("weights", {})
    return weights


def stamps(last: float, count: int, weight: float) -> list[float]:
    """The stamps of ``count`` jobs of one key whose counter now reads ``last`` (after the
    dispatch added ``count / weight``): the first ``count`` steps of ``1 / weight`` ending
    at ``last``, oldest first."""
    step = 1.0 / weight
    start = last - count * step
    return [start + (index + 1) * step for index in range(count)]
