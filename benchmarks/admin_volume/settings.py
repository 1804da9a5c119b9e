"""Django settings of the admin-at-volume benchmark: the soak's (benchmarks/soak/settings.py:
the database from ``DATABASE_URL``, ``GATOR_PARTITIONING`` from ``GATOR_SOAK_PARTITIONING``,
the soak's job classes for the workflows it creates) with the admin as the pruning
benchmark sets it up, and the queues' figures read at every scrape
(``GATOR_METRICS_CACHE_SECONDS = 0``: the cost a scrape has when its cache has expired, not
the cached answer)."""

from __future__ import annotations

from benchmarks.pruning.settings import INSTALLED_APPS as ADMIN_APPS
from benchmarks.pruning.settings import MIDDLEWARE, TEMPLATES  # noqa: F401 - Django reads them
from benchmarks.soak.settings import *  # noqa: F403

ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
INSTALLED_APPS = [*ADMIN_APPS, "benchmarks.soak.app"]
ROOT_URLCONF = "benchmarks.admin_volume.urls"
GATOR_METRICS_CACHE_SECONDS = 0
