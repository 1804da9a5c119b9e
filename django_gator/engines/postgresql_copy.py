"""PostgreSQL's COPY of a large ``dispatch_many``: ids reserved from the sequence in one
statement, the rows sent with COPY (no parameters, no plan), the NOTIFY after them, in one
transaction. The columns of a job insert, which the INSERT of engines/postgresql_inserts.py
sends in the same order, are declared here."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import transaction

from django_gator.engines.postgresql_sessions import CHANNEL, PostgresSessions

#: dispatch_many of at least this many rows uses COPY (below it, one INSERT ... unnest()
#: statement, which costs less than COPY's extra round trips).
COPY_MIN_ROWS = 1000
#: Rows per write() of the COPY data.
COPY_CHUNK = 5000
#: (InsertRow attribute, SQL type of the parameter, SQL of the value in the SELECT list):
#: the columns of a job insert, in the order the INSERT and the COPY send them.
INSERT_COLUMNS = (
    ("name", "text", "{}"),
    ("args", "text", "{}::jsonb"),
    ("kwargs", "text", "{}::jsonb"),
    ("queue", "text", "{}"),
    ("priority", "smallint", "{}"),
    ("run_at", "timestamptz", "COALESCE({}, statement_timestamp())"),
    ("chain_id", "uuid", "{}"),
    ("chain_position", "smallint", "{}"),
    ("chain", "text", "{}::jsonb"),
    ("unique_key", "text", "{}"),
    ("batch_id", "bigint", "{}"),
    ("concurrency_key", "text", "{}"),
)
#: InsertRow attributes left out of a COPY when they are NULL in every row.
_COPY_OPTIONAL = frozenset({"chain_id", "chain_position", "chain", "unique_key"})
#: Columns named differently from their InsertRow attribute.
_COPY_NAMES = {"run_at": "next_execution_at"}
#: InsertRow attributes that hold JSON text and are never NULL.
_JSON = frozenset({"args", "kwargs"})
#: ``count`` ids from the jobs table's sequence, and the statement's time. The sequence is
#: looked up once (MATERIALIZED), not once per id: that took 0.3 s of a 100,000-row COPY.
_RESERVE_IDS = (
    "WITH s AS MATERIALIZED (SELECT pg_get_serial_sequence(%s, 'id')::regclass AS seq) "
    "SELECT array(SELECT nextval(s.seq) FROM s, generate_series(1, %s)), "
    "statement_timestamp()"
)

#: The columns that vary from row to row, each with its converter to COPY text.
Varying = list[tuple[list[Any], Callable[[list[Any]], list[str]]]]


class PostgresCopy(PostgresSessions):
    """The COPY part of :class:`~django_gator.engines.postgresql.PostgresEngine`."""

    def _copy_jobs(
        self,
        count: int,
        columns: dict[str, Any],
        notify: set[str] | None,
        meanwhile: Callable[[list[int], datetime], None] | None,
        prepare: Callable[[int], None] | None,
        encode: Callable[[int, int], None] | None = None,
    ) -> tuple[list[int], datetime]:
        """A large dispatch_many: ids reserved from the sequence in one statement, the rows
        sent with COPY (no parameters, no plan), the NOTIFY after them; all in one
        transaction (a savepoint inside the caller's), so that, like the INSERT, it is all
        or nothing and the NOTIFY is delivered only on commit.

        ``encode(start, stop)``, when given, checks and encodes the arguments of each chunk
        just before it is built, so the client's checks overlap PostgreSQL's parsing of the
        chunks already sent; a bad item raises there, which ends the COPY with an error
        (psycopg sends CopyFail) and rolls the savepoint back: nothing is inserted.

        What every row shares is formatted once, into the end of each line; columns NULL in
        every row (chains, unique keys) and those whose database default is the value
        (state, attempts, rescues, last_error) are left out. The lines are built and sent
        COPY_CHUNK rows at a time, so PostgreSQL reads one chunk while the next is built;
        the first chunk is checked while the ids are drawn; ``prepare(stop)`` builds the
        Job objects of each chunk once it is sent, and ``meanwhile`` runs after the last,
        before the COPY's end, both while PostgreSQL reads what the socket holds. (Built
        before the COPY, while the ids were drawn, which takes PostgreSQL less time, the
        Job objects delayed its start by 1 to 2 microseconds a row.)"""
        first = min(COPY_CHUNK, count)
        with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
            ids, now = self._reserve_ids(
                cursor, count, None if encode is None else lambda: encode(0, first)
            )
            names, varying, end = _copy_layout(ids, now, columns)
            statement = f"COPY {self.job_table} ({', '.join(names)}) FROM STDIN"
            raw = cursor.cursor  # psycopg's own cursor: Django's wrapper has no copy()
            # The driver's errors as Django's (DataError, ...), as from cursor.execute().
            with self.connection.wrap_database_errors, raw.copy(statement) as copy:
                for start in range(0, count, COPY_CHUNK):
                    stop = min(start + COPY_CHUNK, count)
                    if encode is not None and start:
                        encode(start, stop)
                    texts = [convert(values[start:stop]) for values, convert in varying]
                    lines = map("\t".join, zip(*texts, strict=True)) if len(texts) > 1 else texts[0]
                    copy.write(end.join(lines) + end)
                    if prepare is not None:  # while PostgreSQL reads the lines just sent
                        prepare(stop)
                if meanwhile is not None:
                    meanwhile(ids, now)
            if notify:
                cursor.execute(
                    "SELECT count(pg_notify(%s, q)) FROM unnest(%s::text[]) AS q",
                    [CHANNEL, sorted(notify)],
                )
        return ids, now

    def _reserve_ids(
        self, cursor: Any, count: int, meanwhile: Callable[[], None] | None
    ) -> tuple[list[int], datetime]:
        """``count`` ids from the sequence, in order, and the statement's time.

        Pipelined: ``meanwhile()`` (the first chunk's checks and JSON) runs while
        PostgreSQL draws the ids (the query is sent, its answer read after)."""
        with self.connection.wrap_database_errors, self.connection.connection.pipeline():
            cursor.execute(_RESERVE_IDS, [self.job_table, count])
            if meanwhile is not None:
                meanwhile()
            ids, now = cursor.fetchone()
        ids.sort()
        return ids, now


def _copy_layout(
    ids: list[int], now: datetime, columns: dict[str, Any]
) -> tuple[list[str], Varying, str]:
    """The COPY's column names (those that vary from row to row first, then those every
    row shares), the varying columns with their converters, and the end of every line:
    the shared values, formatted once."""
    now_text = now.isoformat()
    names = ["id"]
    varying: Varying = [(ids, _copy_ints)]
    shared = [now_text]
    shared_names = ["created_at"]
    for attr, _, _ in INSERT_COLUMNS:
        values = columns[attr]
        name = _COPY_NAMES.get(attr, attr)
        # run_at None: due now (the statement's time, as the INSERT's COALESCE)
        null = now_text if attr == "run_at" else "\\N"
        if isinstance(values, list):
            names.append(name)
            varying.append((values, _copy_json if attr in _JSON else _texts(null)))
        elif values is not None or attr not in _COPY_OPTIONAL:
            shared_names.append(name)
            shared.append(_copy_text(values, null))
    return names + shared_names, varying, "\t" + "\t".join(shared) + "\n"


def _copy_ints(values: list[int]) -> list[str]:
    return list(map(str, values))


def _copy_json(values: list[str]) -> list[str]:
    """JSON text as COPY's text format wants it: JSON has no raw tab, newline or carriage
    return (the encoder escapes control characters), so only backslashes are doubled."""
    return [value.replace("\\", "\\\\") for value in values]


def _texts(null: str) -> Callable[[list[Any]], list[str]]:
    """A converter of values to COPY text, None written as ``null``."""
    return lambda values: [_copy_text(value, null) for value in values]


def _copy_text(value: Any, null: str) -> str:
    """A value as COPY's text format writes it; None as ``null``."""
    if value is None:
        return null
    if isinstance(value, str):
        if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
            value = (
                value.replace("\\", "\\\\")
                .replace("\t", "\\t")
                .replace("\n", "\\n")
                .replace("\r", "\\r")
            )
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)
