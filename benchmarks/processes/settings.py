"""Settings of the processes benchmark and of the worker processes it starts.

The database comes from ``DATABASE_URL`` (the harness sets a fresh SQLite file unless one
is given). GATOR_* settings are the package defaults except a short poll interval, so that
a burst worker's start and end cost the same in both runs."""

from __future__ import annotations

import os

import environ

SECRET_KEY = "django-gator-processes-bench"  # noqa: S105 - a local benchmark, never served
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {"default": environ.Env().db_url_config(os.environ["DATABASE_URL"])}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )

INSTALLED_APPS = ["django_gator", "benchmarks.processes.app.apps.ProcessesBenchConfig"]
GATOR_POLL_INTERVAL = 0.05
GATOR_SCHEDULER = False

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_gator": {"handlers": ["console"], "level": "WARNING"}},
}
