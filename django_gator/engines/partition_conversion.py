"""Moving an existing jobs table into the partitioned layout while workers keep running
(``gator_partitions --convert``), and back to a plain table (``--revert``, offline).

The online conversion, in four steps, none of which holds a lock that stops the claims
for longer than a catalogue change:

1. Build the partitioned table beside the plain one (``django_gator_job_new``), with the
   time partitions the finished rows need and those ahead.
2. Install a trigger on the plain table that mirrors every insert, update and delete into
   the new one (in the writer's transaction: the two never disagree about a row written
   from then on).
3. Copy the rows that were there before, ``batch_size`` ids at a time, each batch locking
   its rows (FOR SHARE) before it copies those the trigger has not (see _copy_batch), so
   no batch ever copies a stale version.
4. Check the copy (one statement: one snapshot of both tables), then swap: lock the plain
   table (ACCESS EXCLUSIVE), rename it to ``django_gator_job_plain`` (kept, with its
   indexes renamed, until ``--drop-backup``) and the new one to ``django_gator_job``, and
   move the id sequence on. Claims wait for this transaction only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, transaction

from django_gator.engines.ends import move_job_trigger
from django_gator.engines.partition_indexes import (
    FINISHED_ONLY,
    finished_only,
    local_leaves,
    move_statistics,
)
from django_gator.engines.partitions import (
    ACTIVE_LIST,
    AHEAD,
    DEAD_LIST,
    DONE_LIST,
    GRANULARITIES,
    LOCK_TIMEOUT,
    PartitioningError,
    Partitions,
    check_granularity,
)

logger = logging.getLogger("django_gator.engines")

NEW = "django_gator_job_new"
MIRROR = "django_gator_job_mirror"
#: Tries of one batch that concurrent writes keep refusing before the conversion stops.
BATCH_TRIES = 50


class Conversion(Partitions):
    """Convert the jobs table of ``alias`` (see the module's docstring)."""

    # -- the plain table to the partitioned layout ------------------------------------------

    def convert(
        self,
        granularity: str,
        *,
        batch_size: int = 10_000,
        progress: Callable[[str], None] = lambda _: None,
    ) -> int:
        """The online conversion; returns the rows copied by the batches."""
        check_granularity(granularity)
        self._require_postgresql()
        if self.is_partitioned():
            raise PartitioningError(f"the jobs table on {self.alias!r} is partitioned already")
        if self._exists(self.names["backup"]):
            raise PartitioningError(
                f"{self.names['backup']!r} (a previous conversion's copy of the plain table) "
                "still exists: drop it first with `manage.py gator_partitions --drop-backup`"
            )
        if not self._exists(NEW):
            self._build(granularity)
            progress(f"built {NEW} and its partitions")
        self._install_mirror()
        progress("mirroring writes into the new table")
        copied = self._backfill(batch_size, progress)
        self._swap(progress)
        return copied

    def _exists(self, name: str) -> bool:
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
            return bool(cursor.fetchone()[0])

    def _build(self, granularity: str) -> None:
        """Step 1, in one transaction: the new table, its list partitions, its indexes
        (temporary names until the swap), its time partitions."""
        plain, new = self.qn(self.names["parent"]), self.qn(NEW)
        names = {key: self.qn(value) for key, value in self.names.items()}
        with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
            cursor.execute(
                f"CREATE TABLE {new} (LIKE {plain} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
                " PARTITION BY LIST (state)"
            )
            cursor.execute(f"CREATE SEQUENCE {self.qn(NEW + '_id_seq')} OWNED BY {new}.id")
            cursor.execute(
                f"ALTER TABLE {new} ALTER COLUMN id SET DEFAULT nextval(%s::regclass)",
                [NEW + "_id_seq"],
            )
            indexes = [
                (name, definition, local_leaves(definition, unique))
                for name, definition, primary, unique in self.index_definitions(
                    self.names["parent"]
                )
                if not primary
            ]
            for name, definition, leaves in indexes:
                if not leaves:
                    cursor.execute(self._on(finished_only(definition), f"{name}_n", NEW))
            for key, values in (("active", ACTIVE_LIST), ("dead", DEAD_LIST)):
                self._leaf(cursor, self.names[key], key, NEW)
                cursor.execute(
                    f"ALTER TABLE {new} ATTACH PARTITION {names[key]} FOR VALUES IN {values}"
                )
            for name, definition, leaves in indexes:
                for leaf in leaves:  # named as they will be by _swap_locked
                    cursor.execute(self._on(definition, f"{name}__{leaf}", self.names[leaf]))
            cursor.execute(
                f"CREATE TABLE {names['done']} PARTITION OF {new} FOR VALUES IN {DONE_LIST}"
                " PARTITION BY RANGE (finished_at)"
            )
            self._leaf(cursor, self.names["default"], "default", NEW)
            cursor.execute(
                f"ALTER TABLE {names['done']} ATTACH PARTITION {names['default']} DEFAULT"
            )
            self._copy_options(cursor, self.names["parent"], [names["active"], names["dead"]])
            cursor.execute(
                f"SELECT min(finished_at), statement_timestamp() FROM {plain}"
                f" WHERE state IN {DONE_LIST} AND finished_at IS NOT NULL"
            )
            oldest, now = cursor.fetchone()
        ahead = now + AHEAD[granularity] * GRANULARITIES[granularity]
        self.ensure_span(oldest or now, ahead, granularity)

    def _copy_options(self, cursor: Any, source: str, targets: list[str]) -> None:
        """The storage parameters of ``source`` (the autovacuum settings docs/deployment.md
        recommends) set on ``targets`` too: a partitioned table has none of its own."""
        cursor.execute("SELECT reloptions FROM pg_class WHERE oid = to_regclass(%s)", [source])
        row = cursor.fetchone()
        if row is not None and row[0]:
            for target in targets:
                cursor.execute(f"ALTER TABLE {target} SET ({', '.join(row[0])})")

    def _install_mirror(self) -> None:
        """Step 2: the trigger (CREATE TRIGGER waits for the writes under way, with a lock
        timeout, and is tried again)."""
        plain, new, mirror = self.qn(self.names["parent"]), self.qn(NEW), self.qn(MIRROR)
        with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
            cursor.execute(
                f"CREATE OR REPLACE FUNCTION {mirror}() RETURNS trigger LANGUAGE plpgsql AS $$"
                " BEGIN"
                f" IF TG_OP <> 'INSERT' THEN DELETE FROM {new} WHERE id = OLD.id; END IF;"
                f" IF TG_OP <> 'DELETE' THEN INSERT INTO {new} SELECT NEW.*; END IF;"
                " RETURN NULL; END $$"
            )
        self._locked(
            f"DROP TRIGGER IF EXISTS {mirror} ON {plain}; CREATE TRIGGER {mirror}"
            f" AFTER INSERT OR UPDATE OR DELETE ON {plain} FOR EACH ROW EXECUTE FUNCTION"
            f" {mirror}()"
        )

    def _locked(self, sql: str, then: Callable[[Any], None] | None = None) -> None:
        """``sql`` in a transaction whose locks wait at most LOCK_TIMEOUT, tried again
        (with a pause) until it gets them; ``then(cursor)`` in the same transaction."""
        for attempt in range(1, 1000):
            try:
                with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
                    cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                    cursor.execute(sql)
                    if then is not None:
                        then(cursor)
                return
            except DatabaseError as exc:
                if "lock timeout" not in str(exc):
                    raise
                logger.warning("Conversion waits for a lock try=%s", attempt)
                time.sleep(min(0.1 * attempt, 5.0))  # deliberate: let the writers through
        raise PartitioningError("the conversion never got its lock on the jobs table")

    def _backfill(self, batch_size: int, progress: Callable[[str], None]) -> int:
        """Step 3: copy the rows with ids up to the highest at the start, a batch at a time."""
        plain = self.qn(self.names["parent"])
        with self.connection.cursor() as cursor:
            cursor.execute(f"SELECT COALESCE(min(id), 1), COALESCE(max(id), 0) FROM {plain}")
            low, high = cursor.fetchone()
        copied = 0
        start = low
        while start <= high:
            end = start + batch_size - 1
            copied += self._copy_batch(start, end)
            progress(f"copied ids up to {min(end, high)} of {high} ({copied} rows)")
            start = end + 1
        return copied

    def _copy_batch(self, start: int, end: int) -> int:
        """One batch, in two statements of one READ COMMITTED transaction: the first locks
        the batch's rows (FOR SHARE, waiting for the writes under way on them), the second,
        whose snapshot is taken once they are all locked, copies those the trigger has not
        copied already. Every write to them committed before that snapshot (its trigger's
        copy is seen and skipped), and none can come until the batch commits (then its
        trigger replaces the batch's copy). A deadlock with a worker's write is tried again."""
        plain, new = self.qn(self.names["parent"]), self.qn(NEW)
        for attempt in range(1, BATCH_TRIES + 1):
            try:
                with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
                    cursor.execute(
                        f"SELECT count(*) FROM (SELECT id FROM {plain}"
                        " WHERE id BETWEEN %s AND %s ORDER BY id FOR SHARE) AS locked",
                        [start, end],
                    )
                    cursor.execute(
                        f"INSERT INTO {new} SELECT p.* FROM {plain} p WHERE p.id BETWEEN %s"
                        f" AND %s AND NOT EXISTS (SELECT 1 FROM {new} n WHERE n.id = p.id)",
                        [start, end],
                    )
                    return int(cursor.rowcount)
            except DatabaseError as exc:
                if not _refused(exc):
                    raise
            time.sleep(min(0.01 * attempt, 0.5))  # deliberate: the writers of these rows
        raise PartitioningError(
            f"ids {start}-{end}: deadlocks with the workers' writes refused the copy "
            f"{BATCH_TRIES} times; run the conversion again (it goes on where it stopped) "
            "or with a lower --batch-size"
        )

    def _swap(self, progress: Callable[[str], None]) -> None:
        """Step 4."""
        plain = self.qn(self.names["parent"])
        progress("checking the copy")
        self._verify()
        progress("swapping the tables")
        started = time.monotonic()
        self._locked(f"LOCK TABLE {plain} IN ACCESS EXCLUSIVE MODE", self._swap_locked)
        progress(f"swapped in {1000 * (time.monotonic() - started):.0f} ms (lock waits included)")

    def _verify(self) -> None:
        """Both tables hold the same rows in the same states. One statement, so one
        snapshot of both: the trigger writes the copy in the writer's transaction, so any
        snapshot sees a write in both tables or in neither, and no lock is needed. (After
        it, every write is mirrored the same way until the swap.)"""
        plain, new = self.qn(self.names["parent"]), self.qn(NEW)
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT (SELECT count(*) FROM {plain}), (SELECT count(*) FROM {new}),"
                f" (SELECT count(*) FROM {plain} p WHERE NOT EXISTS"
                f" (SELECT 1 FROM {new} n WHERE n.id = p.id AND n.state = p.state))"
            )
            in_plain, in_new, missing = cursor.fetchone()
        if in_plain != in_new or missing:
            raise PartitioningError(
                f"the copy differs from the plain table (rows {in_plain} there, {in_new} in "
                f"the copy, {missing} missing or stale): nothing was swapped"
            )

    def _swap_locked(self, cursor: Any) -> None:
        names = self.names
        plain, new, backup = self.qn(names["parent"]), self.qn(NEW), self.qn(names["backup"])
        cursor.execute(f"DROP TRIGGER {self.qn(MIRROR)} ON {plain}")
        cursor.execute(f"DROP FUNCTION {self.qn(MIRROR)}()")
        cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [names["parent"]])
        sequence = cursor.fetchone()[0]
        cursor.execute(
            "SELECT setval(%s::regclass, nextval(%s::regclass))", [NEW + "_id_seq", sequence]
        )
        old_indexes = self.index_definitions(names["parent"])
        cursor.execute(f"ALTER TABLE {plain} RENAME TO {backup}")
        for name, _, _, _ in old_indexes:
            cursor.execute(f"ALTER INDEX {self.qn(name)} RENAME TO {self.qn(name[:57] + '_plain')}")
        cursor.execute(f"ALTER TABLE {new} RENAME TO {plain}")
        move_job_trigger(cursor, self.qn, names["backup"], names["parent"], partitioned=True)
        move_statistics(cursor, self.qn, names["backup"], names["parent"])
        # The sequences' names follow their tables' (the kept plain table's first).
        cursor.execute(
            f"ALTER SEQUENCE {sequence} RENAME TO {self.qn(names['backup'] + '_id_seq')}"
        )
        cursor.execute(
            f"ALTER SEQUENCE {self.qn(NEW + '_id_seq')} RENAME TO"
            f" {self.qn(names['parent'] + '_id_seq')}"
        )
        for name, _, primary, _ in old_indexes:
            if not primary and self._exists(f"{name}_n"):
                cursor.execute(f"ALTER INDEX {self.qn(name + '_n')} RENAME TO {self.qn(name)}")
        self._name_local_indexes(cursor)
        # The active partition's primary key is the one claims and marks use: the plain
        # table's name, so that plans read the same.
        cursor.execute(
            f"ALTER INDEX {self.qn(names['active'] + '_pkey')} RENAME TO"
            f" {self.qn(names['parent'] + '_pkey')}"
        )

    def _name_local_indexes(self, cursor: Any) -> None:
        """The indexes of the active and dead partitions of their own (local_leaves()) get
        the plain table's names: ``gator_job_ready`` on the active partition; on the dead
        one too unless the active one has it (then ``gator_job_groups_dead``)."""
        on_active = set()
        for leaf in ("active", "dead"):
            for name, _, _, _ in self.index_definitions(self.names[leaf], local=True):
                if not name.endswith(f"__{leaf}"):
                    continue
                base = name[: -len(f"__{leaf}")]
                final = f"{base}_dead" if leaf == "dead" and base in on_active else base
                on_active.add(base)
                cursor.execute(f"ALTER INDEX {self.qn(name)} RENAME TO {self.qn(final)}")

    # -- back to a plain table ---------------------------------------------------------------

    def revert(self) -> int:
        """Copy the partitioned table into a plain one and swap them, in one transaction
        that holds ACCESS EXCLUSIVE on the jobs table throughout (claims wait for it: a
        second or so per 100,000 rows). Returns the rows copied."""
        self.require_partitioned()
        copied: list[int] = []
        self._locked(
            f"LOCK TABLE {self.qn(self.names['parent'])} IN ACCESS EXCLUSIVE MODE",
            lambda cursor: copied.append(self._revert_locked(cursor)),
        )
        return copied[0]

    def _revert_locked(self, cursor: Any) -> int:
        names = self.names
        parent, plain = self.qn(names["parent"]), self.qn(NEW)
        indexes: dict[str, tuple[str, str]] = {}  # by what they index: (name, definition)
        for table in (names["parent"], names["active"], names["dead"]):
            for name, definition, primary, _ in self.index_definitions(table, local=True):
                definition = definition.replace(_as_read(FINISHED_ONLY), "")
                body = definition.partition(" USING ")[2]
                if not primary and body not in indexes:
                    indexes[body] = (name, definition)
        cursor.execute(
            f"CREATE TABLE {plain} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        self._copy_options(cursor, names["active"], [plain])
        cursor.execute(f"INSERT INTO {plain} SELECT * FROM {parent}")
        copied = int(cursor.rowcount)
        cursor.execute(
            f"ALTER TABLE {plain} ADD CONSTRAINT {self.qn(NEW + '_pkey')} PRIMARY KEY (id)"
        )
        for name, definition in indexes.values():
            cursor.execute(self._on(definition, f"{name}_n", NEW))
        cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [names["parent"]])
        sequence = cursor.fetchone()[0]
        if sequence:
            cursor.execute(f"ALTER SEQUENCE {sequence} OWNED BY NONE")
        move_statistics(cursor, self.qn, names["parent"], NEW)
        cursor.execute(f"DROP TABLE {parent}")
        cursor.execute(f"ALTER TABLE {plain} RENAME TO {parent}")
        move_job_trigger(cursor, self.qn, names["parent"], names["parent"], partitioned=False)
        cursor.execute(
            f"ALTER INDEX {self.qn(NEW + '_pkey')} RENAME TO {self.qn(names['parent'] + '_pkey')}"
        )
        for name, _ in indexes.values():
            cursor.execute(f"ALTER INDEX {self.qn(name + '_n')} RENAME TO {self.qn(name)}")
        if sequence:
            cursor.execute(f"ALTER SEQUENCE {sequence} OWNED BY {parent}.id")
        return copied

    def drop_backup(self) -> bool:
        """Drop the plain table a conversion kept; False if there is none."""
        self._require_postgresql()
        if not self._exists(self.names["backup"]):
            return False
        self._locked(f"DROP TABLE {self.qn(self.names['backup'])}")
        return True


def _refused(exc: BaseException) -> bool:
    """PostgreSQL ended the batch's transaction to break a deadlock (SQLSTATE 40P01) or
    refused it as not serializable (40001)."""
    cause = exc.__cause__ or exc
    return getattr(cause, "sqlstate", None) in ("40001", "40P01")


def _as_read(condition: str) -> str:
    """FINISHED_ONLY as pg_get_indexdef() writes it back."""
    states = ", ".join(
        f"{s}::character varying" for s in condition.split("IN (")[1][:-1].split(", ")
    )
    return f" WHERE ((state)::text = ANY ((ARRAY[{states}])::text[]))"
