"""The keyset positions of the limited claims (PostgreSQL), and the rows they are kept by.

As the ordinary claim's (worker/claims.py): claiming leaves dead entries at the start of the
ready index that PostgreSQL removes only once no open transaction can see them, and a read
from the start steps over all of them. So when the last claims of (queue, kind) were all at
one priority, the next read starts that priority from the last job claimed (or
KEYSET_LOOKBACK seconds before now, if earlier), with the higher and lower priorities read
whole; a full read at least every FULL_READ_EVERY seconds finds jobs placed before a
position. Both ways of the limited claim (engines/flow_walk.py, engines/flow_postgresql.py)
keep them here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django_gator.engines.base import Engine

#: Keyset reads (PostgreSQL): each priority is read from no later than this many seconds
#: before now, and a full read is made at least every FULL_READ_EVERY seconds (see
#: KeysetPositions.floor and worker/claims.py, whose keyset claims these follow).
KEYSET_LOOKBACK = 1.0
FULL_READ_EVERY = 10.0


@dataclass(frozen=True)
class Floor:
    """A keyset position of one kind of row: read its priority from after (due, id), or
    from ``lookback`` seconds before now if that is earlier; higher and lower priorities
    whole (see engines/flow.py)."""

    priority: int
    due: Any
    id: int


class Candidate(NamedTuple):
    """A ready row a limited claim read."""

    id: int
    name: str
    key: str | None
    priority: int
    due: datetime
    raw_due: Any  # as the database returned it (for the next chunk's WHERE)

    def order(self) -> tuple[int, datetime, int]:
        """Sorts like the claim: priority first, then due time, then id."""
        return (-self.priority, self.due, self.id)


class KeysetPositions:
    """The keyset positions of one engine's limited claims, per (queue, kind of row)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        #: Keyset reads (PostgreSQL): per (queue, keyed), the position of the last job
        #: claimed at each priority, and when the last full read was (see _floor).
        self.keyset = engine.supports_keyset
        self._floors: dict[tuple[str, bool], dict[int, tuple[Any, int]]] = {}
        self._full_at: dict[tuple[str, bool], float] = {}
        #: The rows the claim under way read, in the order read (see _advance).
        self._seen: list[Candidate] = []

    def _floor(self, queue: str, keyed: bool) -> Floor | None:
        """The keyset position of (queue, kind) for the next read, or None for a full read
        (see the module docstring)."""
        if not self.keyset:
            return None
        key = (queue, keyed)
        floors = self._floors.get(key, {})
        if len(floors) != 1 or time.monotonic() - self._full_at.get(key, 0.0) > FULL_READ_EVERY:
            self._full_at[key] = time.monotonic()
            return None
        [(priority, (due, job_id))] = floors.items()
        return Floor(priority, due, job_id)

    def _floor_parts(
        self, queue: str, keyed: bool, after: Candidate | None, now: datetime
    ) -> list[tuple[str, list[Any]]] | None:
        """The keyset reads of the first chunk (see _floor); None: a full read."""
        floor = None if after is not None else self._floor(queue, keyed)
        if floor is None:
            return None
        due, job_id = floor.due, floor.id
        since = now - timedelta(seconds=KEYSET_LOOKBACK)
        if since < self.engine.to_dt(due):
            due, job_id = since, 0
        priority = floor.priority
        return [
            (" AND priority > %s", [priority]),
            (
                " AND priority = %s AND (next_execution_at > %s OR (next_execution_at = %s"
                " AND id > %s))",
                [priority, due, due, job_id],
            ),
            (" AND priority < %s", [priority]),
        ]

    def _advance(self, queue: str, claimed: set[int]) -> None:
        """Move the keyset positions past the jobs just claimed: per kind, the claimed
        prefix of what the claim read in order (a row it read and left, say of a full key,
        stays after the position)."""
        if not self.keyset:
            return
        for keyed in (True, False):
            seen = sorted(
                (c for c in self._seen if (c.key is not None) == keyed), key=Candidate.order
            )
            prefix: dict[int, tuple[Any, int]] = {}
            for candidate in seen:
                if candidate.id not in claimed:
                    break
                prefix[candidate.priority] = (candidate.raw_due, candidate.id)
            if prefix:
                floors = self._floors.setdefault((queue, keyed), {})
                floors.clear()
                floors.update(prefix)
        self._seen = []
