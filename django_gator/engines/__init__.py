"""One engine per database vendor: the SQL of the hot paths (insert, claim, outcomes, rescue).

``get_engine(alias)`` returns the engine for a database alias, typed as the contract
(:class:`~django_gator.engines.contract.JobEngine`): code outside ``engines/`` calls only
what the contract lists. Engines hold no connection: every call uses
``connections[alias]``, which Django keeps per thread, so one engine serves all the threads
of a worker.
"""

from __future__ import annotations

from functools import cache

from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from django_gator.engines.contract import JobEngine
from django_gator.rows import ClaimedJob, InsertRow

__all__ = ["ClaimedJob", "InsertRow", "JobEngine", "get_engine"]


@cache
def get_engine(alias: str) -> JobEngine:
    vendor = connections[alias].vendor
    if vendor == "postgresql":
        from django_gator.engines.postgresql import PostgresEngine

        return PostgresEngine(alias)
    if vendor == "mysql":
        from django_gator.engines.mysql import MySQLEngine

        return MySQLEngine(alias)
    if vendor == "sqlite":
        from django_gator.engines.sqlite import SQLiteEngine

        return SQLiteEngine(alias)
    raise ImproperlyConfigured(
        f"django-gator supports PostgreSQL, MySQL/MariaDB and SQLite; database alias {alias!r} "
        f"uses {vendor!r}"
    )
