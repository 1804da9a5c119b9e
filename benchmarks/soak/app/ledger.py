"""A per-process ledger of the web-like dispatchers' jobs, in files, never in the database.

The dispatching processes (benchmarks/soak/web.py) write each token they dispatched once
its transaction committed (``dispatched-<pid>.log``), and the token of each one whose
transaction rolled back (``rolledback-<pid>.log``); the workers write a line per run of a
``soak.web`` job, ``<token> <attempt> <ok|fail>`` (``runs-<pid>.log``). The report reads
them all at the end (benchmarks/soak/day.py ``check_ledger``): every committed token ran to
success once, none ran twice outside a rescue, no rolled-back one ran at all. Files rather
than a table, so that the ledger costs the database nothing and survives partition drops
and pruning; the lines are buffered and flushed every second and at exit.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections import defaultdict
from pathlib import Path

_lock = threading.Lock()
_lines: dict[str, list[str]] = defaultdict(list)
_directory: Path | None = None
_started = False


def configure(directory: str | Path) -> None:
    """Write this process's ledger files into ``directory`` (a flusher thread starts)."""
    global _directory, _started
    _directory = Path(directory)
    if not _started:
        _started = True
        threading.Thread(target=_flusher, name="gator-soak-ledger", daemon=True).start()
        atexit.register(flush)


def write(book: str, line: str) -> None:
    """Append ``line`` to this process's ``<book>-<pid>.log`` (buffered)."""
    if _directory is None:
        directory = os.environ.get("GATOR_SOAK_TIMINGS")
        if not directory:
            return  # not started by the harness: nobody reads a ledger
        configure(directory)
    with _lock:
        _lines[book].append(line + "\n")


def flush() -> None:
    global _lines
    with _lock:
        books, _lines = _lines, defaultdict(list)
    if _directory is None:
        return
    for book, lines in books.items():
        if lines:
            with (_directory / f"{book}-{os.getpid()}.log").open("a") as out:
                out.write("".join(lines))


def _flusher() -> None:
    while True:
        time.sleep(1.0)
        flush()


def read(directory: Path, book: str) -> list[list[str]]:
    """Every line of every process's ``book``, split on spaces."""
    rows: list[list[str]] = []
    for path in sorted(directory.glob(f"{book}-*.log")):
        rows += [line.split() for line in path.read_text().splitlines() if line.strip()]
    return rows
