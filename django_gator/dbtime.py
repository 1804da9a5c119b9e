"""Database time, as an ORM expression.

Leases, heartbeats and due times are compared against the database clock, never a worker's.
Django's ``Now()`` renders ``CURRENT_TIMESTAMP(6)`` on MySQL, which is in the session's time
zone; Django stores UTC there, so we use ``UTC_TIMESTAMP(6)`` instead.
"""

from __future__ import annotations

from typing import Any

from django.db.models.functions import Now


class DbNow(Now):
    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template="UTC_TIMESTAMP(6)", **extra_context)
