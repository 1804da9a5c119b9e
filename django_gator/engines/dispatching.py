"""Dispatch statements: inserting jobs (one JSON document per INSERT), unique jobs."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from json.encoder import encode_basestring
from typing import Any

from django.db import IntegrityError, transaction

from django_gator.engines.core import (
    EngineCore,
)
from django_gator.rows import Inserted, InsertRow, JobRows
from django_gator.states import (
    ACTIVE_SQL,
)

_ROW_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
#: Fewest rows whose document is put together from columns (see _column_documents): below,
#: encoding what the rows share separately costs more than it saves.
COLUMN_DOCUMENT_ROWS = 20
#: A str as a JSON string, as _ROW_ENCODER writes one.
_quote = encode_basestring


def _json_strings(values: list[str | None] | None, count: int) -> Iterable[str]:
    """Each value as JSON (a string, or null); ``count`` nulls for None."""
    if values is None:
        return itertools.repeat("null", count)
    return ["null" if value is None else _quote(value) for value in values]


def answered(
    returned: Sequence[tuple[int, datetime, datetime]],
    meanwhile: Callable[[Inserted], None] | None,
) -> Inserted:
    """insert_jobs()'s answer (a tuple per row) by column, handed to ``meanwhile`` too."""
    ids, created_at, next_execution_at = map(list, zip(*returned, strict=True))
    inserted = Inserted(ids, created_at, next_execution_at)
    if meanwhile is not None:
        meanwhile(inserted)
    return inserted


class DispatchStatements(EngineCore):
    """The INSERTs of dispatch."""

    # -- dispatch --------------------------------------------------------------------------
    def insert_jobs(
        self, rows: Sequence[InsertRow], notify: set[str] | None = None
    ) -> list[tuple[int, datetime, datetime]]:
        """Insert jobs; returns (id, created_at, next_execution_at) per row, in order.

        ``notify``: queues whose idle workers wake when the transaction commits (wakeup
        datagrams here, see wake(); PostgreSQL's NOTIFY rides in the INSERT's transaction).

        The rows travel as one JSON document expanded by the database (``json_each`` on
        SQLite, ``JSON_TABLE`` on MariaDB), so a dispatch_many of any length is a single
        INSERT with a single parameter. Only a document over :attr:`insert_bytes` is split,
        and the parts share one transaction.
        """
        inserted = self._insert_documents(self._row_documents(rows))
        self.wake(notify or ())
        return inserted

    def streams_rows(self, count: int) -> bool:
        """Whether :meth:`insert_rows` of ``count`` rows checks and encodes their arguments
        itself as it sends them (``JobRows.encode``), instead of being handed them settled."""
        return False

    def insert_rows(
        self,
        rows: JobRows,
        notify: set[str] | None = None,
        prepare: Callable[[int], None] | None = None,
        meanwhile: Callable[[Inserted], None] | None = None,
    ) -> Inserted:
        """:meth:`insert_jobs` for the rows of one dispatch call, given by column (what
        the rows share is encoded once); the answer by column too.

        The caller's work in two callbacks runs where the database may be busy, so that
        it takes no time of its own there: ``prepare(n)`` for the returned objects of the
        first ``n`` rows (here all at once, before the INSERT; PostgreSQL's COPY: a chunk
        at a time, while the server reads the lines sent), ``meanwhile`` with the answer
        once it is known, before this returns (PostgreSQL's COPY: while the server reads
        the last lines). An exception either raises ends the insert, which stores
        nothing."""
        if prepare is not None:
            prepare(len(rows))
        if len(rows) < COLUMN_DOCUMENT_ROWS:
            documents = self._row_documents(rows.rows())
        else:
            documents = self._column_documents(rows)
        inserted = self._insert_documents(documents)
        self.wake(notify or ())
        return answered(inserted, meanwhile)

    def _insert_documents(self, documents: list[str]) -> list[tuple[int, datetime, datetime]]:
        out: list[tuple[int, datetime, datetime]] = []
        # The rows of one call share their created_at and their run_at: each text is read
        # once (a dict, not an lru_cache made per call, which cost a single dispatch more).
        parsed: dict[Any, datetime] = {}

        def parse(value: Any) -> datetime:
            known = parsed.get(value)
            if known is None:
                known = parsed[value] = self.to_dt(value)
            return known

        sql = self._document_insert
        if sql is None:
            sql = self._document_insert = self.insert_sql()  # built once per engine
        context = self.write_transaction() if len(documents) > 1 else self.connection.cursor()
        with context as cursor:
            for document in documents:
                cursor.execute(sql, [document])
                returned = sorted(cursor.fetchall())
                out += [(r[0], parse(r[1]), parse(r[2])) for r in returned]
        return out

    #: Largest JSON document of rows sent in one INSERT.
    insert_bytes = 4_000_000
    #: insert_sql(), once built.
    _document_insert: str | None = None

    def insert_sql(self) -> str:
        """An INSERT ... SELECT ... RETURNING id, created_at, next_execution_at over the
        JSON document of rows ``%s`` (see _row_documents for its shape)."""
        raise NotImplementedError

    def _row_documents(self, rows: Sequence[InsertRow]) -> list[str]:
        """JSON arrays of ``[name, args, kwargs, queue, priority, run_at, chain_id,
        chain_position, chain, unique_key, batch_id, concurrency_key]`` rows, each array under
        :attr:`insert_bytes`."""
        encode = _ROW_ENCODER.encode
        parts = []
        for row in rows:
            run_at = self.adapt_dt(row.run_at)
            parts.append(
                encode(
                    [
                        row.name,
                        row.args,
                        row.kwargs,
                        row.queue,
                        row.priority,
                        None if run_at is None else str(run_at),
                        row.chain_id,
                        row.chain_position,
                        row.chain,
                        row.unique_key,
                        row.batch_id,
                        row.concurrency_key,
                    ]
                )
            )
        return self._documents(parts)

    def _column_documents(self, rows: JobRows) -> list[str]:
        """:meth:`_row_documents` of :class:`JobRows`: what the rows share is encoded once,
        and each row's array is put together from it and the row's own strings."""
        encode = _ROW_ENCODER.encode
        run_at = self.adapt_dt(rows.run_at)
        # '["name",' ... ',queue,priority,run_at,chain_id,chain_position,chain,' ... ']'
        head = encode([rows.name])[:-1] + ","
        middle = (
            ","
            + encode(
                [
                    rows.queue,
                    rows.priority,
                    None if run_at is None else str(run_at),
                    rows.chain_id,
                    rows.chain_position,
                    rows.chain,
                ]
            )[1:-1]
            + ","
        )
        batch = "," + encode(rows.batch_id) + ","
        count = len(rows)
        quote = _quote
        unique_keys = _json_strings(rows.unique_keys, count)
        flow_keys = _json_strings(rows.concurrency_keys, count)
        parts = [
            f"{head}{quote(args)},{quote(kwargs)}{middle}{unique}{batch}{flow}]"
            for args, kwargs, unique, flow in zip(
                rows.args, rows.kwargs, unique_keys, flow_keys, strict=True
            )
        ]
        return self._documents(parts)

    def _documents(self, parts: list[str]) -> list[str]:
        """Rows' JSON arrays joined into JSON arrays of rows, each under insert_bytes."""
        if sum(map(len, parts)) + len(parts) + 2 <= self.insert_bytes:
            return ["[" + ",".join(parts) + "]"]
        documents: list[str] = []
        batch: list[str] = []
        size = 0
        for part in parts:
            if batch and size + len(part) > self.insert_bytes:
                documents.append("[" + ",".join(batch) + "]")
                batch, size = [], 0
            batch.append(part)
            size += len(part) + 1
        documents.append("[" + ",".join(batch) + "]")
        return documents

    # -- unique jobs ---------------------------------------------------------------------
    #: Matches the active row of (name, unique_key) through the database's unique index.
    _unique_match_sql = f"name = %s AND unique_key = %s AND {ACTIVE_SQL}"
    #: Inserts tried per row before a dispatch of a unique job gives up.
    UNIQUE_TRIES = 10

    def insert_unique(
        self, rows: Sequence[InsertRow], notify: set[str] | None = None
    ) -> list[tuple[int, datetime, datetime, bool]]:
        """Insert rows that carry a ``unique_key``; a row whose key already has a waiting,
        failed or running job is not inserted, and that job's (id, created_at,
        next_execution_at) comes back instead. The fourth item is True for a new row.

        The database's unique index decides: a concurrent dispatch of the same key either
        commits first (our INSERT fails inside a savepoint and we read its row) or waits for
        ours. Rows go one at a time, each in its own savepoint, all in one transaction.
        """
        out: list[tuple[int, datetime, datetime, bool]] = []
        seen: dict[tuple[str, str | None], tuple[int, datetime, datetime]] = {}
        with transaction.atomic(using=self.alias):
            for row in rows:
                key = (row.name, row.unique_key)
                if row.unique_key is not None and key in seen:  # None: not unique
                    out.append((*seen[key], False))
                    continue
                job_id, created_at, next_at, created = self._insert_or_find(row, notify)
                seen[key] = (job_id, created_at, next_at)
                out.append((job_id, created_at, next_at, created))
        return out

    def _insert_or_find(
        self, row: InsertRow, notify: set[str] | None
    ) -> tuple[int, datetime, datetime, bool]:
        error: IntegrityError | None = None
        for _ in range(self.UNIQUE_TRIES):
            existing = self._find_unique(row.name, row.unique_key)
            if existing is not None:
                return (*existing, False)
            try:
                with transaction.atomic(using=self.alias):
                    wake = {row.queue} if row.run_at is None and notify else None
                    [inserted] = self.insert_jobs([row], notify=wake)
            except IntegrityError as exc:
                error = exc  # another dispatch took the key since our look: read its row
                continue
            return (*inserted, True)
        raise IntegrityError(
            f"could not insert or find the job {row.name!r} with unique key "
            f"{row.unique_key!r} after {self.UNIQUE_TRIES} tries: {error}"
        )

    def is_deadlock(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the database ended the transaction to break a deadlock, so
        that running it again from the start can succeed."""
        return False

    def _unique_lookup_lock(self) -> str:
        """Appended to the lookup of an active unique row when a plain read could miss the
        newest commit (a snapshot taken earlier in the transaction); empty by default."""
        return ""

    def _find_unique(self, name: str, key: str | None) -> tuple[int, datetime, datetime] | None:
        """(id, created_at, next_execution_at) of the active job holding ``key``, if any."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id, created_at, next_execution_at FROM {self.job_table} "
                f"WHERE {self._unique_match_sql}{self._unique_lookup_lock()}",
                [name, key],
            )
            row = cursor.fetchone()
        return None if row is None else (row[0], self.to_dt(row[1]), self.to_dt(row[2]))
