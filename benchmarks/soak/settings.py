"""Django settings for the soak harness and the worker processes it starts.

The database comes from ``DATABASE_URL``. The GATOR_* settings are the package defaults
(heartbeat every 5 s, 30 s timeout, connections kept 300 s): the soak measures the worker
as it is deployed, not the test suite's fast heartbeats. Except: the queue ``soak-limited``
has a concurrency limit, and the harness sets the automatic pruner's retention and
interval (``--prune-after``, ``--prune-interval``) through ``GATOR_SOAK_PRUNE_AFTER`` and
``GATOR_SOAK_PRUNE_INTERVAL`` (``off``: no automatic pruning), and partitioned storage
(``--partitioning``) through ``GATOR_SOAK_PARTITIONING``, and ``GATOR_NOTIFY`` (``--notify``)
through ``GATOR_SOAK_NOTIFY``.
"""

from __future__ import annotations

import os

import environ

SECRET_KEY = "django-gator-soak"  # noqa: S105 - a local benchmark, never served
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {"default": environ.Env().db_url_config(os.environ["DATABASE_URL"])}
# Named connections, so that the harness can tell the workers' database backends (and
# their CPU time) from its own in pg_stat_activity.
if "mysql" in DATABASES["default"]["ENGINE"]:
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("charset", "utf8mb4")
if "postgresql" in DATABASES["default"]["ENGINE"]:
    DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = (
        f"gator-soak-{os.environ.get('GATOR_SOAK_ROLE', 'harness')}"
    )

INSTALLED_APPS = ["django_gator", "benchmarks.soak.app"]

GATOR_QUEUES = {"soak-limited": {"concurrency": 3}}  # app/jobs.py LIMITED_CONCURRENCY
_prune_after = os.environ.get("GATOR_SOAK_PRUNE_AFTER", "off")
GATOR_AUTO_PRUNE = _prune_after != "off"
if GATOR_AUTO_PRUNE:
    GATOR_PRUNE_SUCCEEDED_AFTER = float(_prune_after)
    GATOR_PRUNE_CANCELLED_AFTER = float(_prune_after)
    GATOR_PRUNE_INTERVAL = float(os.environ.get("GATOR_SOAK_PRUNE_INTERVAL", "300"))

GATOR_PARTITIONING = os.environ.get("GATOR_SOAK_PARTITIONING") or None
GATOR_NOTIFY = os.environ.get("GATOR_SOAK_NOTIFY", "on") != "off"  # --notify

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
