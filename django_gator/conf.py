"""Typed access to the ``GATOR_*`` settings.

Every value is read from ``django.conf.settings`` at the moment it is needed, so
``override_settings`` works in tests and nothing is frozen at import time.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # Database alias that holds the jobs table.
    "GATOR_DATABASE": "default",
    # Defer the INSERT of every dispatch to transaction.on_commit (see dispatch()).
    "GATOR_DISPATCH_ON_COMMIT": False,
    # Largest accepted JSON payload (args + kwargs), in bytes.
    "GATOR_MAX_PAYLOAD_BYTES": 1_048_576,
    # Worker defaults.
    "GATOR_CONCURRENCY": 4,
    "GATOR_POLL_INTERVAL": 1.0,
    "GATOR_HEARTBEAT_INTERVAL": 5.0,
    "GATOR_HEARTBEAT_TIMEOUT": 30.0,
    "GATOR_MAX_RESCUES": 3,
    "GATOR_SHUTDOWN_TIMEOUT": 30.0,
    # PostgreSQL: worker bookkeeping writes skip the WAL flush (see README).
    "GATOR_ASYNC_COMMIT": True,
    # Seconds a worker thread keeps its database connection when CONN_MAX_AGE is 0.
    "GATOR_WORKER_CONN_MAX_AGE": 300,
    # Characters of a traceback kept per attempt in the error history.
    "GATOR_MAX_TRACEBACK_CHARS": 20_000,
}


def get(name: str) -> Any:
    return getattr(settings, name, DEFAULTS[name])


def database() -> str:
    return str(get("GATOR_DATABASE"))


def dispatch_on_commit() -> bool:
    return bool(get("GATOR_DISPATCH_ON_COMMIT"))


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


def max_rescues() -> int:
    return int(get("GATOR_MAX_RESCUES"))


def shutdown_timeout() -> float:
    return float(get("GATOR_SHUTDOWN_TIMEOUT"))


def max_traceback_chars() -> int:
    return int(get("GATOR_MAX_TRACEBACK_CHARS"))
