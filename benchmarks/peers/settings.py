"""Django settings shared by every peer's worker and by the driver that measures it.

``BENCH_PEER`` picks the peer: only its app is installed, so that no peer's signals,
middleware or migrations run during another's measurement. The database comes from
``BENCH_DATABASE_URL``; the ledger the jobs write their start times to (the same for every
peer, and not the database under test) is Redis at ``BENCH_REDIS_URL``.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

PEER = os.environ.get("BENCH_PEER", "gator")
DATABASE_URL = os.environ.get(
    "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gator_peers"
)
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379")


def _database(url: str) -> dict[str, object]:
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"BENCH_DATABASE_URL must be a postgres:// URL, not {url!r}")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        # Every peer keeps its connections open across jobs, as in production.
        "CONN_MAX_AGE": None,
    }


SECRET_KEY = "django-gator-peers-benchmark"  # noqa: S105 - never served
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {"default": _database(DATABASE_URL)}

PEER_APPS = {
    "gator": ["django_gator"],
    "celery": [],
    "procrastinate": ["procrastinate.contrib.django"],
    "djangoq": ["django_q"],
    "tasksdb": ["django_tasks", "django_tasks_db"],
}
if PEER not in PEER_APPS:
    raise ValueError(f"BENCH_PEER must be one of {sorted(PEER_APPS)}, not {PEER!r}")
INSTALLED_APPS = ["django.contrib.contenttypes", *PEER_APPS[PEER], "benchmarks.peers.benchapp"]

# django-q2 with its ORM broker (the database is the broker, as for every peer here but
# Celery). Its documented defaults, but the worker count, set by the driver, and the
# broker's polling interval: 0.1 s (its default is 0.2 s), as django-tasks-db's worker is
# started with, so that the two pollers are compared at the same interval.
Q_CLUSTER = {
    "name": "bench",
    "orm": "default",
    "workers": int(os.environ.get("BENCH_PROCESSES", "1")),
    "timeout": 60,
    "retry": 120,
    "catch_up": False,
    "poll": 0.1,
    "log_level": "WARNING",
}

# django-tasks' database backend (django-tasks-db).
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": []}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
