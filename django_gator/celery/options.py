"""Celery's task and call options, checked: each one django-gator runs as Celery does is
mapped, each one it cannot is refused with :class:`NotSupported` naming it and what to use
instead. Nothing is ignored silently."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from django_gator.celery.exceptions import NotSupported
from django_gator.limits import UNITS
from django_gator.validation import short_repr, validate_priority, validate_queue

#: Celery's defaults for the options this front maps.
DEFAULTS: dict[str, Any] = {
    "bind": False,
    "name": None,
    "queue": None,
    "priority": None,
    "max_retries": 3,
    "default_retry_delay": 180,
    "autoretry_for": (),
    "dont_autoretry_for": (),
    "retry_kwargs": {},
    "retry_backoff": False,
    "retry_backoff_max": 600,
    "retry_jitter": True,
    "rate_limit": None,
    "time_limit": None,
    "expires": None,
    "acks_late": True,
    "reject_on_worker_lost": True,
    "track_started": True,
    "ignore_result": False,
    "serializer": "json",
    "typing": True,
}

#: Options accepted with one value only: (the value, why no other).
ONE_VALUE: dict[str, tuple[Any, str]] = {
    "acks_late": (
        True,
        "a job is marked done only after it ran (a job of a lost worker runs again): "
        "there is no acknowledge-before-run mode; remove the option",
    ),
    "reject_on_worker_lost": (
        True,
        "the job of a lost worker always runs again (it is rescued); remove the option",
    ),
    "track_started": (
        True,
        "a running job's state is always STARTED; remove the option",
    ),
    "serializer": ("json", "arguments and results are stored as JSON; pass JSON values"),
    "typing": (True, "arguments are always checked against the function when dispatched"),
}

#: Task options refused whatever their value: what to use instead.
REFUSED: dict[str, str] = {
    "soft_time_limit": (
        "django-gator has no limit a task can catch and survive; use time_limit (the "
        "attempt fails at the limit, and JobTimeout is raised into the running code)"
    ),
    "base": "custom Task classes are not supported; use a django_gator.Queueable subclass",
    "shadow_name": "a task's name is its registered job name; use name=",
    "trail": "no task tree is kept; use a chain or workflow and self.results()",
    "send_events": "there are no worker events; use django-gator's signals and metrics",
    "store_errors_even_if_ignored": "every failure is stored on the job row; remove it",
    "compression": "arguments are stored as JSON in the database; remove it",
    "throws": "expected errors are logged as any error; catch them in the task",
    "resultrepr_maxsize": "results are stored whole (GATOR_MAX_RESULT_BYTES bounds them)",
    "lazy": "tasks are created when the module is imported; remove it",
}

#: apply_async() options refused: what to use instead.
CALL_REFUSED: dict[str, str] = {
    "link": "use chain(task.s(...), callback.s())",
    "link_error": "use a django_gator Workflow with on_error=",
    "task_id": "ids are the job's own, given when it is dispatched",
    "time_limit": "set time_limit= on the task",
    "soft_time_limit": "no soft limit exists here; set time_limit= on the task",
    "routing_key": "use queue=",
    "exchange": "use queue=",
    "serializer": "arguments are stored as JSON",
    "compression": "arguments are stored as JSON",
    "headers": "pass the values as arguments",
    "shadow": "a job's name is its task's name",
    "ignore_result": "set ignore_result= on the task",
    "retry": "dispatch is an INSERT in your database: there is no broker to retry against",
    "retry_policy": "dispatch is an INSERT in your database: there is no broker to retry against",
}

#: rate_limit: the Celery forms whose spacing django-gator's windows express exactly.
RATE_SPACINGS = {float(seconds): unit for unit, seconds in UNITS.items()}


def refuse(what: str, name: str, value: Any, why: str) -> NotSupported:
    return NotSupported(f"{what}: {name}={short_repr(value)} is not supported: {why}")


def task_options(where: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Celery's task options checked and completed with Celery's defaults; NotSupported
    naming the first one that has no faithful equivalent, ValueError naming a bad value."""
    for key, value in options.items():
        if key in REFUSED:
            raise refuse(where, key, value, REFUSED[key])
        if key in ONE_VALUE and value != ONE_VALUE[key][0]:
            raise refuse(where, key, value, ONE_VALUE[key][1])
        if key not in DEFAULTS:
            raise NotSupported(
                f"{where}: {key}= is not a task option django-gator maps (mapped: "
                f"{', '.join(sorted(DEFAULTS))}); see docs/celery.md"
            )
    checked = {**DEFAULTS, **options}
    _check_values(where, checked)
    checked["rate_limit"] = gator_rate(where, checked["rate_limit"])
    return checked


def _check_values(where: str, opts: dict[str, Any]) -> None:
    if opts["queue"] is not None:
        validate_queue(opts["queue"])
    if opts["priority"] is not None:
        validate_priority(opts["priority"])
    max_retries = opts["max_retries"]
    if max_retries is not None and (
        isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0
    ):
        raise ValueError(f"{where}: max_retries must be an int >= 0 or None, got {max_retries!r}")
    for key in ("default_retry_delay", "retry_backoff_max", "time_limit", "expires"):
        value = opts[key]
        if value is None and key in ("time_limit", "expires"):
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise ValueError(f"{where}: {key} must be a number of seconds >= 0, got {value!r}")
    for key in ("autoretry_for", "dont_autoretry_for"):
        classes = opts[key] = tuple(opts[key])
        if not all(isinstance(c, type) and issubclass(c, BaseException) for c in classes):
            raise ValueError(f"{where}: {key} must be exception classes, got {classes!r}")
    backoff = opts["retry_backoff"]
    if not isinstance(backoff, bool | int | float) or not backoff >= 0:
        raise ValueError(f"{where}: retry_backoff must be a bool or a factor in seconds")
    extra = set(opts["retry_kwargs"]) - {"max_retries", "countdown"}
    if extra:
        raise refuse(
            where,
            "retry_kwargs",
            opts["retry_kwargs"],
            f"only max_retries and countdown map, not {', '.join(sorted(extra))}",
        )


def gator_rate(where: str, value: Any) -> str | None:
    """Celery's ``rate_limit`` as django-gator's, or NotSupported.

    Celery spaces a task's starts evenly (a token bucket of one token per worker: "10/m"
    starts one every 6 s); django-gator counts starts in a window ("10/m" lets ten start
    in any minute, at once if they are due). The two agree when Celery's spacing is one
    second, minute or hour: then "1/s", "1/m" or "1/h" here allows exactly that spacing."""
    if value is None or value == "":
        return None
    text = str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
    if not isinstance(text, str):
        raise ValueError(f"{where}: rate_limit must be a str such as '1/s', got {value!r}")
    count, _, unit = text.strip().partition("/")
    unit = unit.strip() or "s"
    try:
        spacing = UNITS[unit] / float(count)
    except (KeyError, ValueError, ZeroDivisionError):
        raise ValueError(
            f"{where}: rate_limit must be Celery's '<count>/<s|m|h>', got {value!r}"
        ) from None
    if spacing not in RATE_SPACINGS:
        raise refuse(
            where,
            "rate_limit",
            value,
            f"Celery starts this task once every {spacing:g} s on each worker, and "
            "django-gator's limits count starts per second, minute or hour across all "
            "workers; use a rate whose spacing is 1 s, 1 min or 1 h ('1/s', '60/m', '1/m', "
            "'60/h', '1/h'), or a django_gator @job(rate_limit='10/m') (at most ten starts "
            "in any minute, bursts included)",
        )
    return f"1/{RATE_SPACINGS[spacing]}"


def backoff_countdown(options: Mapping[str, Any], retries: int) -> float:
    """Celery's autoretry wait: ``retry_backoff * 2**retries`` capped at
    ``retry_backoff_max``, drawn uniformly from 0 to that with ``retry_jitter``."""
    factor = int(max(1, options["retry_backoff"]))
    countdown = min(options["retry_backoff_max"], factor * 2**retries)
    if options["retry_jitter"]:
        countdown = random.randrange(int(countdown) + 1)
    return float(max(0, countdown))


def call_options(where: str, options: Mapping[str, Any]) -> None:
    """Refuse the ``apply_async()`` options that are not mapped, naming them."""
    for key, value in options.items():
        why = CALL_REFUSED.get(
            key, "no equivalent (mapped: args, kwargs, countdown, eta, expires, queue, priority)"
        )
        raise refuse(where, key, value, why)
