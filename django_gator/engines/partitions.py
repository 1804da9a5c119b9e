"""PostgreSQL's partitioned jobs table (``GATOR_PARTITIONING``): its layout, and the upkeep
that creates time partitions ahead and drops them whole once retention has passed.

The layout (made by ``gator_partitions --convert``, engines/partition_conversion.py)::

    django_gator_job                 PARTITION BY LIST (state)
      django_gator_job_active        waiting, failed, running: every claim, mark and
                                     unique key; the only partition with the unique index
      django_gator_job_dead          dead: kept until an operator retries or prunes them
      django_gator_job_done          succeeded, cancelled: PARTITION BY RANGE (finished_at)
        django_gator_job_done_20261127_0000   [2026-11-27 00:00, 2026-11-28 00:00)
        ...                                   one per day or hour, created ahead
        django_gator_job_done_default         rows no time partition takes (a missing one)

Every index of the plain table lives on the parent (so every partition has it), except the
primary key, which PostgreSQL would have include the partition keys: each partition has
its own primary key on ``id`` (the sequence keeps ids unique across them), and the unique
jobs' index, which lives on the active partition only (uniqueness is among active jobs).

A success mark moves its row from the active partition to the day's (PostgreSQL's row
movement: a delete and an insert), so finished jobs leave the hot partition's indexes at
once, and the day's partition is dropped whole: no DELETE, no dead rows, no vacuum.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DatabaseError, connections, transaction

from django_gator.models import Job
from django_gator.states import ACTIVE_STATES, JobState, sql_list

logger = logging.getLogger("django_gator.engines")

GRANULARITIES = {"day": timedelta(days=1), "hour": timedelta(hours=1)}
#: Time partitions kept ready ahead of now, per granularity.
AHEAD = {"day": 3, "hour": 24}
#: States of each list partition.
ACTIVE_LIST = sql_list(ACTIVE_STATES)
DONE_LIST = sql_list([JobState.SUCCEEDED, JobState.CANCELLED])
DEAD_LIST = sql_list([JobState.DEAD])
#: How long an upkeep DDL statement waits for its lock before it gives up until next time
#: (a DROP or ATTACH must not queue the success marks behind a long transaction).
LOCK_TIMEOUT = "500ms"
_INDEX = re.compile(r"^CREATE (UNIQUE )?INDEX (\S+) ON (ONLY )?(\S+) ")
FIX = "run `manage.py gator_partitions --create` (or start a worker with GATOR_PARTITIONING set)"


class PartitioningError(RuntimeError):
    """The jobs table is not in the layout the operation needs; the message says the fix."""


@dataclass(frozen=True)
class TimePartition:
    name: str
    start: datetime
    end: datetime


def table_names() -> dict[str, str]:
    """The names of the layout's tables (unquoted)."""
    base = Job._meta.db_table
    return {
        "parent": base,
        "active": f"{base}_active",
        "dead": f"{base}_dead",
        "done": f"{base}_done",
        "default": f"{base}_done_default",
        "backup": f"{base}_plain",
    }


def slot_start(moment: datetime, granularity: str) -> datetime:
    """The start of the day or hour (UTC) that holds ``moment``."""
    moment = moment.astimezone(UTC)
    if granularity == "day":
        return moment.replace(hour=0, minute=0, second=0, microsecond=0)
    return moment.replace(minute=0, second=0, microsecond=0)


def check_granularity(granularity: str | None) -> str:
    if granularity not in GRANULARITIES:
        raise PartitioningError(
            f"GATOR_PARTITIONING must be 'day' or 'hour' for this, got {granularity!r}"
        )
    return granularity


def partition_name(start: datetime) -> str:
    return f"{table_names()['done']}_{start.astimezone(UTC):%Y%m%d_%H%M}"


class Partitions:
    """The partitions of the jobs table on the PostgreSQL database ``alias``."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.names = table_names()

    @property
    def connection(self) -> Any:
        return connections[self.alias]

    @staticmethod
    def available(alias: str) -> bool:
        """Whether database ``alias`` can have partitioned storage (PostgreSQL)."""
        return bool(connections[alias].vendor == "postgresql")

    def qn(self, name: str) -> str:
        return str(self.connection.ops.quote_name(name))

    def _require_postgresql(self) -> None:
        if self.connection.vendor != "postgresql":
            raise PartitioningError(
                f"partitioned storage needs PostgreSQL; database {self.alias!r} is "
                f"{self.connection.vendor}: it keeps DELETE pruning (gator_prune)"
            )

    def is_partitioned(self) -> bool:
        """Whether the jobs table is the partitioned layout."""
        if self.connection.vendor != "postgresql":
            return False
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT c.relkind FROM pg_class c WHERE c.oid = to_regclass(%s)",
                [self.names["parent"]],
            )
            row = cursor.fetchone()
        return row is not None and row[0] == "p"

    def require_partitioned(self) -> None:
        self._require_postgresql()
        if not self.is_partitioned():
            raise PartitioningError(
                f"the jobs table {self.names['parent']!r} on {self.alias!r} is a plain table: "
                "convert it first with `manage.py gator_partitions --convert`"
            )

    def time_partitions(self) -> list[TimePartition]:
        """The time partitions of the finished jobs, oldest first (not the default), with
        their bounds read from their bound expressions, in one statement."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT name, b[1]::timestamptz, b[2]::timestamptz FROM (SELECT c.relname AS"
                " name, regexp_match(pg_get_expr(c.relpartbound, c.oid),"
                " 'FROM \\(''([^'']+)''\\) TO \\(''([^'']+)''\\)') AS b"
                " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE i.inhparent = to_regclass(%s)) AS p WHERE b IS NOT NULL ORDER BY 2",
                [self.names["done"]],
            )
            return [TimePartition(*row) for row in cursor.fetchall()]

    def index_definitions(
        self, table: str, *, local: bool = False
    ) -> list[tuple[str, str, bool, bool]]:
        """(name, CREATE INDEX statement, primary, unique) of each index of ``table``
        itself (a partitioned table's own, not its partitions'); ``local``: only those that
        are not a partition of a parent's index."""
        inherited = (
            " AND NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = i.indexrelid)"
            if local
            else ""
        )
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisprimary,"
                " i.indisunique FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                f" WHERE i.indrelid = to_regclass(%s){inherited} ORDER BY c.relname",
                [table],
            )
            return [(r[0], r[1], r[2], r[3]) for r in cursor.fetchall()]

    def _on(self, definition: str, name: str, table: str) -> str:
        """``definition`` (pg_get_indexdef) re-aimed: index ``name`` on ``table``."""
        match = _INDEX.match(definition)
        if match is None:
            raise PartitioningError(f"cannot read the index definition {definition!r}")
        unique = match.group(1) or ""
        rest = definition[match.end() :]
        return f"CREATE {unique}INDEX {self.qn(name)} ON {self.qn(table)} {rest}"

    def _leaf(self, cursor: Any, table: str, suffix: str, root: str) -> None:
        """Create the leaf partition ``table`` (not attached yet) with the root's indexes,
        each named after the root's with ``suffix`` (``gator_job_ready_active``), so that
        ATTACH adopts them and the plans name them; and its primary key."""
        quoted = self.qn(table)
        cursor.execute(
            f"CREATE TABLE {quoted} (LIKE {self.qn(root)} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        building = root != self.names["parent"]  # a conversion's root: names end in _n
        for name, definition, primary, unique in self.index_definitions(root):
            if not primary and not unique:
                base = name[:-2] if building and name.endswith("_n") else name
                cursor.execute(self._on(definition, f"{base}_{suffix}"[:63], table))
        cursor.execute(f"ALTER TABLE {quoted} ADD PRIMARY KEY (id)")

    def default_rows(self) -> int:
        """Finished jobs that no time partition took: they sit in the default partition
        until one is created for their time (see :meth:`ensure`)."""
        with self.connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {self.qn(self.names['default'])}")
            return int(cursor.fetchone()[0])

    def ensure(self, now: datetime, granularity: str, ahead: int | None = None) -> list[str]:
        """Create the time partitions from the slot of ``now`` to ``ahead`` slots past it,
        and those that the rows of the default partition need (moving the rows into them);
        returns the names created. A slot that an existing partition covers in part is cut
        to what is free, so a change of granularity leaves neither overlap nor gap."""
        self.require_partitioned()
        step = GRANULARITIES[check_granularity(granularity)]
        count = AHEAD[granularity] if ahead is None else ahead
        first = slot_start(now, granularity)
        wanted = [first + i * step for i in range(count + 1)]
        wanted += [slot_start(t, granularity) for t in self._stray_times()]
        created: list[str] = []
        for start in sorted(set(wanted)):
            for free_start, free_end in self._free(start, start + step):
                try:
                    self._create(free_start, free_end)
                except DatabaseError as exc:
                    if "lock timeout" not in str(exc):
                        raise
                    logger.warning("Partition creation postponed start=%s reason=lock", start)
                    return created
                created.append(partition_name(free_start))
        return created

    def ensure_span(self, since: datetime, until: datetime, granularity: str) -> list[str]:
        """Time partitions for every slot from ``since`` to ``until`` (a conversion's: the
        finished rows it will copy, and the slots ahead)."""
        step = GRANULARITIES[check_granularity(granularity)]
        start = slot_start(since, granularity)
        created = []
        while start <= until:
            for free_start, free_end in self._free(start, start + step):
                self._create(free_start, free_end)
                created.append(partition_name(free_start))
            start += step
        return created

    def _stray_times(self) -> list[datetime]:
        """One finished_at of each hour that has rows in the default partition (at most
        a few hundred: one ensure() pass's work)."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT DISTINCT date_trunc('hour', finished_at) FROM"
                f" {self.qn(self.names['default'])} WHERE finished_at IS NOT NULL LIMIT 500"
            )
            return [row[0] for row in cursor.fetchall()]

    def _free(self, start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
        """The parts of [start, end) no time partition covers."""
        free = [(start, end)]
        for part in self.time_partitions():
            pieces = []
            for s, e in free:
                if part.end <= s or part.start >= e:
                    pieces.append((s, e))
                    continue
                if s < part.start:
                    pieces.append((s, part.start))
                if part.end < e:
                    pieces.append((part.end, e))
            free = pieces
        return free

    def _create(self, start: datetime, end: datetime) -> None:
        """One time partition: a table of its own, filled with its rows from the default
        partition if there are any, then attached (SHARE UPDATE EXCLUSIVE on the parent:
        the success marks, which insert into it, go on meanwhile)."""
        name = partition_name(start)
        table, done, default = self.qn(name), self.qn(self.names["done"]), self.names["default"]
        with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            cursor.execute(
                "SELECT c.relname FROM pg_class c WHERE c.oid = pg_partition_root(%s::regclass)",
                [self.names["done"]],
            )
            self._leaf(cursor, name, name.rsplit("_done_", 1)[1], cursor.fetchone()[0])
            cursor.execute(
                f"WITH moved AS (DELETE FROM {self.qn(default)} WHERE finished_at >= %s"
                f" AND finished_at < %s RETURNING *) INSERT INTO {table} SELECT * FROM moved",
                [start, end],
            )
            moved = cursor.rowcount
            cursor.execute(
                f"ALTER TABLE {done} ATTACH PARTITION {table} FOR VALUES FROM (%s) TO (%s)",
                [start, end],
            )
        if moved:
            logger.warning(
                "Moved finished jobs out of the default partition partition=%s rows=%s",
                name,
                moved,
            )
        logger.info("Created partition partition=%s start=%s end=%s", name, start, end)

    def drop_before(self, cutoff: datetime) -> list[str]:
        """Drop the time partitions that end at or before ``cutoff``; returns their names.
        One that cannot get its lock within LOCK_TIMEOUT is left for the next pass."""
        self.require_partitioned()
        dropped = []
        for part in self.time_partitions():
            if part.end > cutoff:
                break
            try:
                with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
                    cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                    cursor.execute(f"DROP TABLE {self.qn(part.name)}")
            except DatabaseError as exc:
                if "lock timeout" not in str(exc):
                    raise
                logger.warning("Partition drop postponed partition=%s reason=lock", part.name)
                break
            logger.info("Dropped partition partition=%s end=%s", part.name, part.end)
            dropped.append(part.name)
        return dropped

    def sizes(self) -> list[tuple[str, str, int]]:
        """(name, bounds, estimated rows) of every leaf partition, for the command's list."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT c.relname, COALESCE(pg_get_expr(c.relpartbound, c.oid), ''),"
                " GREATEST(c.reltuples, 0)::bigint FROM pg_partition_tree(%s::regclass) t"
                " JOIN pg_class c ON c.oid = t.relid WHERE t.isleaf ORDER BY c.relname",
                [self.names["parent"]],
            )
            return [(row[0], row[1], int(row[2])) for row in cursor.fetchall()]

    def check_default(self) -> int:
        """Log an error naming the fix if the default partition holds rows; returns them."""
        rows = self.default_rows()
        if rows:
            logger.error(
                "Finished jobs in the default partition rows=%s partition=%s: no time "
                "partition covered their finished_at; %s",
                rows,
                self.names["default"],
                FIX,
            )
        return rows
