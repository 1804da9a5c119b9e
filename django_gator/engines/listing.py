"""What the admin's job list asks the database before it reads a large list: the
planner's estimate of a filtered list's size (see ``django_gator.admin.listing``)."""

from __future__ import annotations

import json
from typing import Any

from django.db import DatabaseError, connections


def planned_rows(queryset: Any) -> int | None:
    """PostgreSQL's estimate of the rows ``queryset`` returns (EXPLAIN, nothing run), or
    None elsewhere or if it cannot tell."""
    if connections[queryset.db].vendor != "postgresql":
        return None
    try:
        plan = json.loads(queryset.order_by().explain(format="json"))
        return int(plan[0]["Plan"]["Plan Rows"])
    except (DatabaseError, ValueError, KeyError, IndexError, TypeError):
        return None
