"""A database router for several job databases (``GATOR_QUEUE_DATABASES``), added in one line::

    DATABASE_ROUTERS = ["django_gator.routers.JobDatabaseRouter"]

- ``migrate --database ALIAS`` creates django-gator's tables in every job database
  (``GATOR_DATABASE`` and each alias ``GATOR_QUEUE_DATABASES`` names) and in no other;
  the other apps' tables are left to the project's other routers (the router says nothing
  about them);
- ``Job.objects...`` (and the other django-gator models) without ``.using()`` read and
  write ``GATOR_DATABASE``; a row keeps the database it was read from (``job.save()``,
  ``job.retry()``, ``job.cancel()`` write there), and ``Job.objects.using(alias)`` reads
  another job database;
- two django-gator rows may be related only within one database.
"""

from __future__ import annotations

from typing import Any

from django_gator import conf
from django_gator.databases import job_databases

APP_LABEL = "django_gator"


class JobDatabaseRouter:
    """Sends django-gator's models to the job databases; says nothing of other apps."""

    def _ours(self, model: Any) -> bool:
        return getattr(getattr(model, "_meta", None), "app_label", None) == APP_LABEL

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        if not self._ours(model):
            return None
        return self._home(hints)

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        if not self._ours(model):
            return None
        return self._home(hints)

    def _home(self, hints: dict[str, Any]) -> str:
        """The database of the row in the hints, if it has one, else GATOR_DATABASE."""
        instance = hints.get("instance")
        db = getattr(getattr(instance, "_state", None), "db", None)
        return str(db) if db else conf.database()

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        if self._ours(obj1) and self._ours(obj2):
            return bool(obj1._state.db == obj2._state.db)
        return None

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        if app_label != APP_LABEL:
            return None
        return db in job_databases()
