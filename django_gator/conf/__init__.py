"""The ``GATOR_*`` settings: one declared table, and typed access to it.

:data:`SETTINGS` declares each setting once: its name, default, the values it allows and
what it means. Everything else comes from that table: the defaults (:data:`DEFAULTS`), the
ranges of the worker's command-line options (:data:`RANGES`, :func:`range_error`), the
system check that validates every setting at start-up (``django_gator.E003``, in
checks.py), the accessors below, which refuse a bad value with the same words, and the
README's settings table (tests/test_conf.py compares them).

Every value is read from ``django.conf.settings`` at the moment it is needed, so
``override_settings`` works in tests and nothing is frozen at import time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from logging import getLevelName
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from django_gator.conf import imports
from django_gator.conf.access import (  # noqa: F401 (re-exported: conf is their public home)
    BY_NAME,
    DEFAULTS,
    RANGES,
    InvalidSetting,
    allowed_range,
    get,
    range_error,
    value,
)
from django_gator.conf.imports import request_autodiscover as request_autodiscover
from django_gator.conf.imports import request_imports as request_imports
from django_gator.conf.imports import requested_imports as requested_imports
from django_gator.conf.rules import Number, Setting, split_host_port  # noqa: F401 (Number, Setting: re-exported)
from django_gator.conf.table import SETTINGS as SETTINGS

# -- accessors ---------------------------------------------------------------------------------


def database() -> str:
    return str(value("GATOR_DATABASE"))


def dispatch_on_commit() -> bool:
    return bool(value("GATOR_DISPATCH_ON_COMMIT"))


def dispatch_on_commit_retry_delays() -> list[float]:
    return [float(v) for v in value("GATOR_DISPATCH_ON_COMMIT_RETRY_DELAYS")]


def max_payload_bytes() -> int:
    return int(value("GATOR_MAX_PAYLOAD_BYTES"))


def max_result_bytes() -> int | None:
    limit = value("GATOR_MAX_RESULT_BYTES")
    return None if limit is None else int(limit)


def max_batch_size() -> int:
    return int(value("GATOR_MAX_BATCH_SIZE"))


def concurrency() -> int:
    return int(value("GATOR_CONCURRENCY"))


def processes() -> int:
    return int(value("GATOR_PROCESSES"))


def async_concurrency() -> int:
    return int(value("GATOR_ASYNC_CONCURRENCY"))


def poll_interval() -> float:
    return float(value("GATOR_POLL_INTERVAL"))


def heartbeat_interval() -> float:
    return float(value("GATOR_HEARTBEAT_INTERVAL"))


def heartbeat_timeout() -> float:
    return float(value("GATOR_HEARTBEAT_TIMEOUT"))


def worker_network_timeout() -> float:
    """GATOR_WORKER_NETWORK_TIMEOUT in seconds (0: off); by default the heartbeat timeout."""
    seconds = value("GATOR_WORKER_NETWORK_TIMEOUT")
    return heartbeat_timeout() if seconds is None else float(seconds)


def wakeup_bind() -> tuple[str, int] | None:
    """GATOR_WAKEUP_BIND as (host, port), or None when wakeups are off."""
    address = value("GATOR_WAKEUP_BIND")
    return None if address is None else split_host_port(address)


def warm_connections() -> list[str] | None:
    """GATOR_WARM_CONNECTIONS: aliases, or None for ``default`` and ``GATOR_DATABASE``."""
    aliases = value("GATOR_WARM_CONNECTIONS")
    return None if aliases is None else list(aliases)


def worker_conn_max_age() -> float | None:
    """GATOR_WORKER_CONN_MAX_AGE: seconds, or None for connections kept without limit."""
    seconds = value("GATOR_WORKER_CONN_MAX_AGE")
    return None if seconds is None else float(seconds)


def async_commit() -> bool:
    return bool(value("GATOR_ASYNC_COMMIT"))


def max_rescues() -> int:
    return int(value("GATOR_MAX_RESCUES"))


def outage_retries() -> int:
    return int(value("GATOR_OUTAGE_RETRIES"))


def max_handbacks() -> int | None:
    """GATOR_MAX_HANDBACKS: every this many hand-backs charge an attempt (None: never)."""
    count = value("GATOR_MAX_HANDBACKS")
    return None if count is None else int(count)


def default_timeout() -> float | None:
    """GATOR_DEFAULT_TIMEOUT: the timeout of job classes that set none (None: no limit)."""
    seconds = value("GATOR_DEFAULT_TIMEOUT")
    return None if seconds is None else float(seconds)


def progress_interval() -> float:
    """GATOR_PROGRESS_INTERVAL: seconds between two progress/checkpoint writes of an
    attempt."""
    return float(value("GATOR_PROGRESS_INTERVAL"))


def job_log_level() -> int | None:
    """GATOR_JOB_LOG_LEVEL as a number (None: no capture)."""
    level = value("GATOR_JOB_LOG_LEVEL")
    return level if level is None or isinstance(level, int) else int(getLevelName(level.upper()))


def job_log_lines() -> int:
    return int(value("GATOR_JOB_LOG_LINES"))


def job_log_bytes() -> int:
    return int(value("GATOR_JOB_LOG_BYTES"))


def long_running_after() -> float:
    return float(value("GATOR_LONG_RUNNING_AFTER"))


def unknown_job_window() -> float:
    return float(value("GATOR_UNKNOWN_JOB_WINDOW"))


def autodiscover_modules() -> list[str]:
    """The module names imported from each installed app to register its jobs."""
    extra = [*value("GATOR_AUTODISCOVER"), *imports.requested_names()]
    names = ["jobs"]
    if uses_tasks_backend():
        names.append("tasks")
    return names + [name for name in dict.fromkeys(extra) if name not in names]


def shutdown_timeout() -> float:
    return float(value("GATOR_SHUTDOWN_TIMEOUT"))


def redact_keys() -> frozenset[str]:
    return frozenset(k.lower() for k in value("GATOR_REDACT"))


def encryption_keys() -> list[str]:
    return list(value("GATOR_ENCRYPTION_KEYS"))


def max_traceback_chars() -> int:
    return int(value("GATOR_MAX_TRACEBACK_CHARS"))


_middleware_lock = threading.Lock()
_middleware_cache: tuple[tuple[str, ...], list[Callable[..., Any]]] = ((), [])


def middleware() -> list[Callable[..., Any]]:
    """``GATOR_MIDDLEWARE`` resolved: each path names a callable ``(job, call_next)``, or a
    class that is instantiated once without arguments to make one."""
    global _middleware_cache
    cached_key, cached = _middleware_cache
    raw = get("GATOR_MIDDLEWARE")
    if isinstance(raw, list | tuple) and tuple(raw) == cached_key:
        return cached  # validated when it was cached (read on every job: kept cheap)
    key = tuple(value("GATOR_MIDDLEWARE"))
    if cached_key == key:
        return cached
    with _middleware_lock:
        resolved = [_load_middleware(path) for path in key]
        _middleware_cache = (key, resolved)
    return resolved


def _load_middleware(path: str) -> Callable[..., Any]:
    try:
        target = import_string(path)
    except ImportError as exc:
        raise InvalidSetting(f"GATOR_MIDDLEWARE: cannot import {path!r}: {exc}") from exc
    if isinstance(target, type):
        target = target()
    if not callable(target):
        raise InvalidSetting(
            f"GATOR_MIDDLEWARE: {path!r} is not callable as middleware(job, call_next)"
        )
    return target


def immediate() -> bool:
    return bool(value("GATOR_IMMEDIATE"))


def queues() -> Mapping[str, Mapping[str, Any]]:
    """``GATOR_QUEUES``: the limits declared per queue."""
    return value("GATOR_QUEUES")


def fairness() -> Mapping[str, Any]:
    """``GATOR_FAIRNESS``: the fair queues and their weights (entries checked by E013)."""
    table: Mapping[str, Any] = value("GATOR_FAIRNESS")
    return table


def schedules() -> Mapping[str, Any]:
    """GATOR_SCHEDULES as declared (its entries are validated by the schedules module)."""
    declared: Mapping[str, Any] = value("GATOR_SCHEDULES")
    return declared


def scheduler_enabled() -> bool:
    return bool(value("GATOR_SCHEDULER"))


def scheduler_interval() -> float:
    return float(value("GATOR_SCHEDULER_INTERVAL"))


def misfire_grace() -> float:
    return float(value("GATOR_SCHEDULE_MISFIRE_GRACE"))


def schedule_run_retention_days() -> float:
    return float(value("GATOR_SCHEDULE_RUN_RETENTION_DAYS"))


def scheduler_clock() -> Callable[[], Any] | None:
    path = value("GATOR_SCHEDULER_CLOCK")
    if path is None or callable(path):
        return path
    clock: Callable[[], Any] = import_string(path)
    return clock


TASKS_BACKEND = "django_gator.tasks.GatorBackend"


def uses_tasks_backend() -> bool:
    """Whether a backend of Django's TASKS setting is ours."""
    backends = getattr(settings, "TASKS", None) or {}
    return isinstance(backends, dict) and any(
        isinstance(entry, dict) and entry.get("BACKEND") == TASKS_BACKEND
        for entry in backends.values()
    )


def prune_succeeded_after() -> float:
    return float(value("GATOR_PRUNE_SUCCEEDED_AFTER"))


def prune_cancelled_after() -> float:
    return float(value("GATOR_PRUNE_CANCELLED_AFTER"))


def prune_dead_after() -> float:
    return float(value("GATOR_PRUNE_DEAD_AFTER"))


def pooled_databases() -> frozenset[str]:
    return frozenset(value("GATOR_POOLED_DATABASES"))


def listen_database() -> str | None:
    alias = value("GATOR_LISTEN_DATABASE")
    return None if alias is None else str(alias)


def auto_prune() -> bool:
    return bool(value("GATOR_AUTO_PRUNE"))


def prune_interval() -> float:
    return float(value("GATOR_PRUNE_INTERVAL"))


def prune_batch_size() -> int:
    return int(value("GATOR_PRUNE_BATCH_SIZE"))


def prune_pause() -> float:
    return float(value("GATOR_PRUNE_PAUSE"))


def metrics_port() -> int | None:
    port = value("GATOR_METRICS_PORT")
    return None if port is None else int(port)


def metrics_cache() -> str:
    return str(value("GATOR_METRICS_CACHE"))


def metrics_cache_seconds() -> float:
    return float(value("GATOR_METRICS_CACHE_SECONDS"))


def partitioning() -> str | None:
    """``"day"``, ``"hour"`` or None (a plain jobs table): GATOR_PARTITIONING."""
    granularity = value("GATOR_PARTITIONING")
    return None if granularity is None else str(granularity)
