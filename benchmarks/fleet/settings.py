"""Django settings of the fleet benchmark's harness, dispatcher and worker processes.

The database comes from ``DATABASE_URL``. Each process names its connections
``gator-fleet-<GATOR_FLEET_ROLE>`` (application_name), so that the harness can tell the
workers' server sessions (and their CPU) from the dispatcher's and its own. With
``GATOR_FLEET_POOLED=1`` the alias is behind PgBouncer in transaction mode: it is listed in
GATOR_POOLED_DATABASES (no server-side prepared statements, nothing set on the session),
and ``GATOR_FLEET_DIRECT_URL`` is a direct alias for LISTEN (docs/deployment.md). The soak's
app is installed for its statement timer (benchmarks/soak/app/timing.py, on when
GATOR_SOAK_TIMINGS names a directory). GATOR_* settings are the package defaults. Warnings
go to stderr (Python's last-resort handler: no LOGGING), kept in each process's log.
"""

from __future__ import annotations

import os

import environ

SECRET_KEY = "django-gator-fleet"  # noqa: S105 - a local benchmark, never served
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_env = environ.Env()
_name = f"gator-fleet-{os.environ.get('GATOR_FLEET_ROLE', 'harness')}"
DATABASES = {"default": _env.db_url_config(os.environ["DATABASE_URL"])}
DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = _name
if os.environ.get("GATOR_FLEET_POOLED") == "1":
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = None
    GATOR_POOLED_DATABASES = ["default"]
    if os.environ.get("GATOR_FLEET_DIRECT_URL"):
        DATABASES["direct"] = _env.db_url_config(os.environ["GATOR_FLEET_DIRECT_URL"])
        DATABASES["direct"]["OPTIONS"] = {"application_name": f"{_name}-listen"}
        GATOR_LISTEN_DATABASE = "direct"

INSTALLED_APPS = ["django_gator", "benchmarks.soak.app", "benchmarks.fleet.app"]
