"""Counts the SQL statements of this process and writes the count to a file twice a second
(the worker process of the pickup benchmark; nothing in django_gator changes)."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

from django.db.backends.signals import connection_created

_count = itertools.count()
_seen = 0


def _wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    global _seen
    _seen = next(_count) + 1
    return execute(sql, params, many, context)


def _on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    if _wrapper not in connection.execute_wrappers:
        connection.execute_wrappers.append(_wrapper)


def install(path: str) -> None:
    connection_created.connect(_on_connection, weak=False)
    target = Path(path)
    partial = target.with_name(target.name + ".partial")

    def write() -> None:
        while True:
            # Whole or not at all: the benchmark reads the file at any moment, and once
            # read it empty (a count of 0, so a negative rate).
            partial.write_text(str(_seen))
            partial.replace(target)
            threading.Event().wait(0.5)

    threading.Thread(target=write, name="pickup-count", daemon=True).start()
