"""A statement timer that the soak installs in its worker processes.

Every SQL statement a worker runs through Django goes through this wrapper; the claims and
the outcome marks (told apart by their SQL) are written with their wall-clock duration to
``<directory>/timings-<pid>.log``, one ``<unix time> <kind> <microseconds> <rows>`` line
each, flushed every second. The durations are what the worker's thread waited for: the
round trip, the server's work and getting the GIL back. Nothing in django_gator changes;
the wrapper comes from Django's ``connection.execute_wrappers``, installed on each new
connection.
"""

from __future__ import annotations

import atexit
import functools
import os
import threading
import time
from pathlib import Path
from typing import Any

from django.db.backends.signals import connection_created

#: The kinds of claim statements kind_of() tells apart: a claim, a keyset claim, and the
#: success marks and a claim in one statement (most claims of a busy worker on PostgreSQL),
#: full or keyset.
CLAIM_KINDS = ("claim", "claim_keyset", "claim_mark", "claim_mark_keyset")

_lock = threading.Lock()
_lines: list[str] = []
_path: Path | None = None


@functools.lru_cache(maxsize=512)
def kind_of(sql: str) -> str | None:
    """The kind of a worker statement, from the SQL the engine builds (None: not timed)."""
    if sql.startswith("WITH marked AS") and "picked AS" in sql:
        # PostgreSQL: success marks and the next claim in one statement
        return "claim_mark_keyset" if "(next_execution_at, id) >" in sql else "claim_mark"
    if sql.startswith("WITH picked AS"):
        return "claim_keyset" if "(next_execution_at, id) >" in sql else "claim"
    if sql.startswith("SELECT") and "ready_rank IS NOT NULL" in sql and "SKIP LOCKED" in sql:
        return "claim"  # MariaDB/MySQL: the claim's locking read (its UPDATE follows)
    if sql.startswith("UPDATE") and "SET state = 'succeeded'" in sql:
        return "mark"
    if sql.startswith("UPDATE") and "errors = " in sql and "rescues = rescues + 1" not in sql:
        return "fail"
    if sql.startswith("UPDATE") and "rescues = rescues + 1" in sql:
        return "rescue"
    if sql.startswith("WITH RECURSIVE q(queue"):
        return "queues"
    if "SET heartbeat_at" in sql:
        return "heartbeat"
    if sql.startswith("SELECT paused, concurrency, rate_limit"):
        return "flow_lock"  # the limited claim's lock of its queue's row (waits included)
    return None


def _rows(kind: str, params: Any) -> int:
    """How many jobs a mark wrote (its batch), or a claim asked for (its LIMIT)."""
    try:
        if kind == "mark":
            first = params[0]
            return len(first) if isinstance(first, list) else 1
        if kind.startswith("claim"):
            try:
                return int(params[-2])
            except ValueError:
                return int(params[-1])  # MariaDB/MySQL: LIMIT is the last parameter
    except (IndexError, TypeError, ValueError):
        pass
    return 1


def timer(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    started = time.perf_counter()
    try:
        return execute(sql, params, many, context)
    finally:
        elapsed = time.perf_counter() - started
        kind = kind_of(sql)
        if kind is not None:
            line = f"{time.time():.3f} {kind} {elapsed * 1e6:.0f} {_rows(kind, params)}\n"
            with _lock:
                _lines.append(line)


def record(kind: str, seconds: float, rows: int = 1) -> None:
    """A timing measured by the caller (the web-like dispatchers' dispatch calls)."""
    line = f"{time.time():.3f} {kind} {seconds * 1e6:.0f} {rows}\n"
    with _lock:
        _lines.append(line)


def flush() -> None:
    global _lines
    with _lock:
        lines, _lines = _lines, []
    if lines and _path is not None:
        with _path.open("a") as out:
            out.write("".join(lines))


def _flusher() -> None:
    while True:
        time.sleep(1.0)
        flush()


def _on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    if timer not in connection.execute_wrappers:
        connection.execute_wrappers.append(timer)


def install(directory: str) -> None:
    global _path
    _path = Path(directory) / f"timings-{os.getpid()}.log"
    connection_created.connect(_on_connection, dispatch_uid="gator-soak-timer")
    threading.Thread(target=_flusher, name="gator-soak-timings", daemon=True).start()
    atexit.register(flush)
