"""The limits of the limited claim (engines/flow.py), and its ledger of starts.

A class's limits (:class:`ClassLimits`) hold per concurrency key; a rate limit, a queue's
or a key's, is counted in the ledger (``django_gator_flow_start``): one row per start and
rate-limited scope, the rows older than their scope's window deleted as they pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django_gator.engines.base import ClaimedJob, Engine
from django_gator.engines.flow_keyset import Candidate
from django_gator.limits import Rate
from django_gator.models import FlowStart


@dataclass(frozen=True)
class ClassLimits:
    """A job class's limits, per key (the whole class when it has no concurrency_key)."""

    concurrency: int | None = None
    rate: Rate | None = None


#: job name -> its class's limits (None: no limits, or a name this worker does not know).
Policy = Callable[[str], ClassLimits | None]


def queue_scope(queue: str) -> str:
    return f"queue:{queue}"


def key_scope(name: str, key: str) -> str:
    return f"job:{name}|{key}"


class Ledger:
    """The ledger of rate-limited starts, as one engine reads and writes it."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.table = engine.connection.ops.quote_name(FlowStart._meta.db_table)

    def starts(
        self, cursor: Any, scopes: Sequence[str], rate: Rate, now: datetime
    ) -> dict[str, int]:
        """Starts per scope within ``rate``'s window ending ``now``."""
        if not scopes:
            return {}
        since = self.engine.adapt_dt(now - timedelta(seconds=rate.seconds))
        counts: dict[str, int] = {}
        for start in range(0, len(scopes), 500):
            part = scopes[start : start + 500]
            cursor.execute(
                f"SELECT scope, COUNT(*) FROM {self.table} WHERE scope IN "
                f"({', '.join(['%s'] * len(part))}) AND started_at > %s GROUP BY scope",
                [*part, since],
            )
            counts.update((r[0], int(r[1])) for r in cursor.fetchall())
        return counts

    def record(
        self,
        cursor: Any,
        queue: str | None,
        rate: Rate | None,
        jobs: Sequence[ClaimedJob],
        picked: Sequence[Candidate],
        policy: Policy,
        now: datetime,
    ) -> None:
        """One ledger row per start and rate-limited scope (``queue``'s, with its ``rate``,
        and each claimed key's with a rate); the rows of those scopes that left their
        window are deleted."""
        claimed = {job.id for job in jobs}
        scopes: list[str] = []
        windows: dict[str, int] = {}
        for candidate in picked:
            if candidate.id not in claimed:
                continue
            if queue is not None and rate is not None:
                scopes.append(queue_scope(queue))
                windows[queue_scope(queue)] = rate.seconds
            limits = policy(candidate.name) if candidate.key is not None else None
            if limits is not None and limits.rate is not None and candidate.key is not None:
                scope = key_scope(candidate.name, candidate.key)
                scopes.append(scope)
                windows[scope] = limits.rate.seconds
        if not scopes:
            return
        at = self.engine.adapt_dt(now)
        cursor.execute(
            f"INSERT INTO {self.table} (scope, started_at) VALUES "
            + ", ".join(["(%s, %s)"] * len(scopes)),
            [item for scope in scopes for item in (scope, at)],
        )
        by_window: dict[int, list[str]] = {}
        for scope, seconds in windows.items():
            by_window.setdefault(seconds, []).append(scope)
        for seconds, names in by_window.items():
            cursor.execute(
                f"DELETE FROM {self.table} WHERE scope IN "
                f"({', '.join(['%s'] * len(names))}) AND started_at <= %s",
                [*names, self.engine.adapt_dt(now - timedelta(seconds=seconds))],
            )
