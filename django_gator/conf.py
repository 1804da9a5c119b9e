"""Typed access to the ``GATOR_*`` settings.

Every value is read from ``django.conf.settings`` at the moment it is needed, so
``override_settings`` works in tests and nothing is frozen at import time.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

DEFAULTS: dict[str, Any] = {
    # Database alias that holds the jobs table.
    "GATOR_DATABASE": "default",
    # Defer the INSERT of every dispatch to transaction.on_commit (see dispatch()).
    "GATOR_DISPATCH_ON_COMMIT": False,
    # Seconds to wait before each new try of a deferred (on_commit) dispatch whose INSERT
    # failed; after the last one the jobs are logged and dispatch_failed is sent.
    "GATOR_DISPATCH_ON_COMMIT_RETRY_DELAYS": [0.5, 1.0, 2.0],
    # Largest accepted JSON payload (args + kwargs), in bytes.
    "GATOR_MAX_PAYLOAD_BYTES": 1_048_576,
    # Worker defaults.
    "GATOR_CONCURRENCY": 4,
    "GATOR_POLL_INTERVAL": 1.0,
    "GATOR_HEARTBEAT_INTERVAL": 5.0,
    "GATOR_HEARTBEAT_TIMEOUT": 30.0,
    "GATOR_MAX_RESCUES": 3,
    "GATOR_SHUTDOWN_TIMEOUT": 30.0,
    # Seconds a job whose name this worker does not know waits for a worker that does
    # (a rolling deploy: new code dispatched it, old code claimed it) before it goes dead.
    "GATOR_UNKNOWN_JOB_WINDOW": 900.0,
    # Modules besides `jobs` (and `tasks` with the Tasks backend) imported from every
    # installed app at start-up to register its jobs.
    "GATOR_AUTODISCOVER": [],
    # PostgreSQL: worker bookkeeping writes skip the WAL flush (see README).
    "GATOR_ASYNC_COMMIT": True,
    # Seconds a worker thread keeps its database connection when CONN_MAX_AGE is 0.
    "GATOR_WORKER_CONN_MAX_AGE": 300,
    # Seconds of silence from the other end after which a worker's database connection is
    # given up, by the worker and by the server (a network partition; see
    # worker/connections.py). None: GATOR_HEARTBEAT_TIMEOUT; 0: the drivers' and servers'
    # own defaults (hours).
    "GATOR_WORKER_NETWORK_TIMEOUT": None,
    # Characters of a traceback kept per attempt in the error history.
    "GATOR_MAX_TRACEBACK_CHARS": 20_000,
    # Argument keys whose values the admin and the logs never show (case-insensitive).
    "GATOR_REDACT": [
        "password",
        "passwd",
        "secret",
        "token",
        "api_key",
        "apikey",
        "access_key",
        "private_key",
        "authorization",
        "credit_card",
        "card_number",
        "cvv",
    ],
    # Dotted paths of middleware wrapped around every job's handle(), outermost first.
    "GATOR_MIDDLEWARE": [],
    # Run each job in the dispatching process as soon as its row is committed (tests).
    "GATOR_IMMEDIATE": False,
    # Cron schedules declared in settings: {name: {"job": ..., "cron": ..., ...}}.
    "GATOR_SCHEDULES": {},
    # Whether gator_worker runs the scheduler loop (it is safe on every worker).
    "GATOR_SCHEDULER": True,
    # Longest pause between two looks at the schedules, in seconds.
    "GATOR_SCHEDULER_INTERVAL": 1.0,
    # An occurrence older than this (seconds) when a worker sees it counts as missed.
    "GATOR_SCHEDULE_MISFIRE_GRACE": 60.0,
    # Days ScheduledRun rows are kept (they only need to outlive a worker's look).
    "GATOR_SCHEDULE_RUN_RETENTION_DAYS": 7,
    # Dotted path of a callable returning the scheduler's "now" (tests); None: database time.
    "GATOR_SCHEDULER_CLOCK": None,
    # gator_prune: seconds after finished_at that finished jobs are kept, per state.
    "GATOR_PRUNE_SUCCEEDED_AFTER": 7 * 24 * 3600,
    "GATOR_PRUNE_CANCELLED_AFTER": 7 * 24 * 3600,
    "GATOR_PRUNE_DEAD_AFTER": 30 * 24 * 3600,
}


#: Allowed ranges of the numeric settings, ``name: (least, most or None)``. The system check
#: (E003) and the worker's command-line options that stand in for a setting
#: (``--poll-interval``, ``--concurrency``, ``--shutdown-timeout``) validate with
#: :func:`range_error`, so a value refused in settings is refused on the command line too.
RANGES: dict[str, tuple[float, float | None]] = {
    "GATOR_CONCURRENCY": (1, None),
    # 0 would make an idle worker poll without pause (a busy loop).
    "GATOR_POLL_INTERVAL": (0.001, None),
    "GATOR_HEARTBEAT_INTERVAL": (0.01, None),
    "GATOR_HEARTBEAT_TIMEOUT": (0.05, None),
    "GATOR_MAX_RESCUES": (1, None),
    "GATOR_SHUTDOWN_TIMEOUT": (0, None),
    "GATOR_UNKNOWN_JOB_WINDOW": (0, None),
    "GATOR_MAX_PAYLOAD_BYTES": (2, None),
    "GATOR_MAX_TRACEBACK_CHARS": (100, None),
    "GATOR_PRUNE_SUCCEEDED_AFTER": (0, None),
    "GATOR_PRUNE_CANCELLED_AFTER": (0, None),
    "GATOR_PRUNE_DEAD_AFTER": (0, None),
}


def allowed_range(name: str) -> str:
    """``"at least 0.001"`` or ``"from 1 to 1000"``: the range of a numeric setting."""
    low, high = RANGES[name]
    return f"at least {low}" if high is None else f"from {low} to {high}"


def range_error(name: str, value: object, given: str | None = None) -> str | None:
    """Why ``value`` is not allowed for the numeric setting ``name`` (``"must be at least
    0.001, got 0"``), or None when it is. ``given`` is how the user wrote the value (the
    command-line text); the default is its repr."""
    shown = repr(value) if given is None else given
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number, got {shown}"
    low, high = RANGES[name]
    if not (math.isfinite(value) and low <= value and (high is None or value <= high)):
        return f"must be {allowed_range(name)}, got {shown}"
    return None


def get(name: str) -> Any:
    return getattr(settings, name, DEFAULTS[name])


def database() -> str:
    return str(get("GATOR_DATABASE"))


def dispatch_on_commit() -> bool:
    return bool(get("GATOR_DISPATCH_ON_COMMIT"))


def dispatch_on_commit_retry_delays() -> list[float]:
    value = get("GATOR_DISPATCH_ON_COMMIT_RETRY_DELAYS")
    if isinstance(value, list | tuple):
        try:
            delays = [float(v) for v in value]
        except (TypeError, ValueError):
            delays = [-1.0]
        if all(0 <= d <= 300 for d in delays):
            return delays
    raise ImproperlyConfigured(
        "GATOR_DISPATCH_ON_COMMIT_RETRY_DELAYS must be a list of seconds from 0 to 300, "
        f"got {value!r}"
    )


def max_payload_bytes() -> int:
    return int(get("GATOR_MAX_PAYLOAD_BYTES"))


def concurrency() -> int:
    return int(get("GATOR_CONCURRENCY"))


def poll_interval() -> float:
    return float(get("GATOR_POLL_INTERVAL"))


def heartbeat_interval() -> float:
    return float(get("GATOR_HEARTBEAT_INTERVAL"))


def heartbeat_timeout() -> float:
    return float(get("GATOR_HEARTBEAT_TIMEOUT"))


def worker_network_timeout() -> float:
    """GATOR_WORKER_NETWORK_TIMEOUT in seconds (0: off); by default the heartbeat timeout."""
    value = get("GATOR_WORKER_NETWORK_TIMEOUT")
    if value is None:
        return heartbeat_timeout()
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e6:
        raise ImproperlyConfigured(
            f"GATOR_WORKER_NETWORK_TIMEOUT must be None, 0 or a number of seconds, got {value!r}"
        )
    return float(value)


def max_rescues() -> int:
    return int(get("GATOR_MAX_RESCUES"))


def unknown_job_window() -> float:
    return float(get("GATOR_UNKNOWN_JOB_WINDOW"))


def autodiscover_modules() -> list[str]:
    """The module names imported from each installed app to register its jobs."""
    extra = get("GATOR_AUTODISCOVER")
    if isinstance(extra, str) or not isinstance(extra, list | tuple):
        raise ImproperlyConfigured(
            f"GATOR_AUTODISCOVER must be a list of module names, got {extra!r}"
        )
    names = ["jobs"]
    if uses_tasks_backend():
        names.append("tasks")
    return names + [str(name) for name in extra if name not in names]


def shutdown_timeout() -> float:
    return float(get("GATOR_SHUTDOWN_TIMEOUT"))


def redact_keys() -> frozenset[str]:
    keys = get("GATOR_REDACT")
    if isinstance(keys, str) or not isinstance(keys, list | tuple | set | frozenset):
        raise ImproperlyConfigured(f"GATOR_REDACT must be a list of key names, got {keys!r}")
    return frozenset(str(k).lower() for k in keys)


def max_traceback_chars() -> int:
    return int(get("GATOR_MAX_TRACEBACK_CHARS"))


_middleware_lock = threading.Lock()
_middleware_cache: tuple[tuple[str, ...], list[Callable[..., Any]]] = ((), [])


def middleware() -> list[Callable[..., Any]]:
    """``GATOR_MIDDLEWARE`` resolved: each path names a callable ``(job, call_next)``, or a
    class that is instantiated once without arguments to make one."""
    global _middleware_cache
    paths = get("GATOR_MIDDLEWARE")
    if isinstance(paths, str) or not isinstance(paths, list | tuple):
        raise ImproperlyConfigured(
            f"GATOR_MIDDLEWARE must be a list of dotted paths, got {paths!r}"
        )
    key = tuple(paths)
    cached_key, cached = _middleware_cache
    if cached_key == key:
        return cached
    with _middleware_lock:
        resolved = [_load_middleware(path) for path in key]
        _middleware_cache = (key, resolved)
    return resolved


def _load_middleware(path: object) -> Callable[..., Any]:
    if not isinstance(path, str):
        raise ImproperlyConfigured(f"GATOR_MIDDLEWARE entries must be dotted paths, got {path!r}")
    try:
        target = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"GATOR_MIDDLEWARE: cannot import {path!r}: {exc}") from exc
    if isinstance(target, type):
        target = target()
    if not callable(target):
        raise ImproperlyConfigured(
            f"GATOR_MIDDLEWARE: {path!r} is not callable as middleware(job, call_next)"
        )
    return target


def immediate() -> bool:
    return bool(get("GATOR_IMMEDIATE"))


def scheduler_enabled() -> bool:
    return bool(get("GATOR_SCHEDULER"))


def scheduler_interval() -> float:
    return float(get("GATOR_SCHEDULER_INTERVAL"))


def misfire_grace() -> float:
    return float(get("GATOR_SCHEDULE_MISFIRE_GRACE"))


def schedule_run_retention_days() -> float:
    return float(get("GATOR_SCHEDULE_RUN_RETENTION_DAYS"))


def scheduler_clock() -> Callable[[], Any] | None:
    path = get("GATOR_SCHEDULER_CLOCK")
    if path is None:
        return None
    if callable(path):
        return path
    return import_string(str(path))


TASKS_BACKEND = "django_gator.tasks.GatorBackend"


def uses_tasks_backend() -> bool:
    """Whether a backend of Django's TASKS setting is ours."""
    backends = getattr(settings, "TASKS", None) or {}
    return isinstance(backends, dict) and any(
        isinstance(entry, dict) and entry.get("BACKEND") == TASKS_BACKEND
        for entry in backends.values()
    )


def prune_succeeded_after() -> float:
    return float(get("GATOR_PRUNE_SUCCEEDED_AFTER"))


def prune_cancelled_after() -> float:
    return float(get("GATOR_PRUNE_CANCELLED_AFTER"))


def prune_dead_after() -> float:
    return float(get("GATOR_PRUNE_DEAD_AFTER"))
