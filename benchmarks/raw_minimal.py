"""The physical limit of a drain on this machine: the smallest claim/ack loop a queue on
PostgreSQL can run, for ``python -m benchmarks.raw_baseline --only drain`` (issue 31).

Its own table holds only what a claim needs::

    id bigserial PRIMARY KEY, queue text, state smallint (0 waiting, 1 running, 2 done),
    priority int, run_at timestamptz

with one partial index, ``(queue, priority DESC, run_at, id) WHERE state = 0``, the order
it claims in. One connection, psycopg alone (no Django, no threads), ``synchronous_commit =
off`` as in the project's raw loop; per round trip, each committed:

- claim ``batch`` (100): ``WITH picked AS (SELECT id ... WHERE queue = %s AND state = 0 AND
  run_at <= now() ORDER BY priority DESC, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED)
  UPDATE ... SET state = 1 FROM picked ... RETURNING id``;
- ack: ``UPDATE ... SET state = 2 WHERE id = ANY(%s)``.

Against the project's raw loop (benchmarks/raw_baseline.py ``raw_drain``), which claims
and marks django-gator's own rows with its statements' shapes (seventeen columns returned,
the attempt count, the worker's name, the compare-and-set on the mark), this leaves out
everything a job system adds to the bare queue.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

TABLE = "raw_minimal_job"


def prepare(dsn: str, count: int) -> None:
    """The table (created if missing), emptied, with ``count`` waiting rows, vacuumed."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(
            f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigserial PRIMARY KEY, queue text NOT "
            "NULL, state smallint NOT NULL DEFAULT 0, priority int NOT NULL DEFAULT 0, "
            "run_at timestamptz NOT NULL DEFAULT now())"
        )
        connection.execute(
            f"CREATE INDEX IF NOT EXISTS {TABLE}_ready ON {TABLE} "
            "(queue, priority DESC, run_at, id) WHERE state = 0"
        )
        connection.execute(f"TRUNCATE {TABLE}")
        with connection.cursor().copy(f"COPY {TABLE} (queue) FROM STDIN") as copy:
            for _ in range(count):
                copy.write_row(("raw",))
        connection.execute(f"VACUUM ANALYZE {TABLE}")


def drain(dsn: str, count: int, batch: int) -> float:
    """Claim ``batch`` waiting rows and ack them, until none is left; rows per second."""
    claim = (
        f"WITH picked AS (SELECT id FROM {TABLE} WHERE queue = %s AND state = 0 "
        "AND run_at <= now() ORDER BY priority DESC, run_at, id LIMIT %s "
        f"FOR UPDATE SKIP LOCKED) UPDATE {TABLE} AS j SET state = 1 FROM picked "
        "WHERE j.id = picked.id RETURNING j.id"
    )
    ack = f"UPDATE {TABLE} SET state = 2 WHERE id = ANY(%s)"

    def step(connection: Any) -> int | None:
        ids = [row[0] for row in connection.execute(claim, ["raw", batch]).fetchall()]
        connection.commit()
        if not ids:
            return None
        acked = connection.execute(ack, [ids]).rowcount
        connection.commit()
        return acked

    done, elapsed = loop(dsn, step)
    if done != count:
        raise RuntimeError(f"minimal drain finished {done} of {count}")
    return count / elapsed


def loop(dsn: str, step: Callable[[Any], int | None]) -> tuple[int, float]:
    """One connection with ``synchronous_commit = off``; ``step(connection)`` (a claim and
    its ack, each committed: the rows acked, None once the claim found nothing) until it
    returns None. The rows acked, and the seconds it took (the connection's set-up left
    out). Shared with the project's raw loop (benchmarks/raw_baseline.py)."""
    import psycopg

    done = 0
    with psycopg.connect(dsn) as connection:
        connection.execute("SET synchronous_commit TO off")
        connection.commit()
        started = time.perf_counter()
        while (acked := step(connection)) is not None:
            done += acked
        return done, time.perf_counter() - started
