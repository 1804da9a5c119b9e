"""Settings of the pickup benchmark and the worker process it starts. The database comes
from ``DATABASE_URL``; the GATOR_* settings are the package defaults (a deployed worker),
except what the benchmark passes in the environment."""

from __future__ import annotations

import os

import environ

SECRET_KEY = "django-gator-pickup"  # noqa: S105 - a local benchmark, never served
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {"default": environ.Env().db_url_config(os.environ["DATABASE_URL"])}
_db = DATABASES["default"]
if _db["ENGINE"] == "django.db.backends.sqlite3":
    _db.setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "timeout": 20,
        }
    )
elif _db["ENGINE"] == "django.db.backends.mysql":
    _db.setdefault("OPTIONS", {}).setdefault("charset", "utf8mb4")

INSTALLED_APPS = ["django_gator", "benchmarks.pickup.app"]

if os.environ.get("GATOR_PICKUP_WAKEUP") == "off":
    GATOR_WAKEUP_BIND = None
if os.environ.get("GATOR_PICKUP_WAKEUP") == "datagrams":
    GATOR_NOTIFY = False
if os.environ.get("GATOR_PICKUP_POLL"):
    GATOR_POLL_INTERVAL = float(os.environ["GATOR_PICKUP_POLL"])

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_gator": {
            "handlers": ["console"],
            "level": os.environ.get("GATOR_LOG_LEVEL", "WARNING"),
        }
    },
}
