"""Captured logs: the log records a job emits while an attempt runs, kept with the attempt.

A job class's ``log_level`` (or, when it sets none, ``GATOR_JOB_LOG_LEVEL``) turns capture
on: every record of that level or above that the attempt emits through the ``logging``
module (its own loggers and those of the libraries it calls, from its thread, or from its
asyncio task and the ``sync_to_async`` calls it awaits) is formatted into one line and kept
in a :class:`LogBuffer`, bounded by ``GATOR_JOB_LOG_LINES`` lines and
``GATOR_JOB_LOG_BYTES`` bytes (the oldest lines are dropped, and counted). When the attempt
ends the buffer becomes one entry of the job's ``logs`` column (see :meth:`LogBuffer.entry`),
written by the same UPDATE as the attempt's last progress and checkpoint.

Which job a record belongs to is read from a context variable that the worker sets for the
attempt's thread or task (:func:`capturing`): 16 threads running 16 jobs each keep their
own lines. A record whose logger's level (or the root's) would drop it is still captured
when the attempt's level asks for it, and goes to the buffer only: the other handlers see
exactly what they saw before. Threads a job starts itself run in a fresh context and are
not captured.

Nothing is installed until an attempt first captures (:func:`install`, two wrappers of
``logging.Logger`` methods that read the context variable): a worker whose jobs capture
nothing runs the ``logging`` module untouched.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from django_gator import conf
from django_gator.redaction import mask_text

#: Marks a line cut to fit GATOR_JOB_LOG_BYTES.
CUT = " [cut]"

_current: contextvars.ContextVar[LogBuffer | None] = contextvars.ContextVar(
    "gator_job_logs", default=None
)
#: (logger, level) that isEnabledFor() let through for the capture alone, in this thread or
#: task: the record that follows goes to the buffer only.
_only: contextvars.ContextVar[tuple[logging.Logger, int] | None] = contextvars.ContextVar(
    "gator_job_logs_only", default=None
)
_install_lock = threading.Lock()
_installed = False


def level_of(value: Any, what: str = "log_level") -> int | None:
    """A logging level from a name (``"INFO"``, any case) or a number; None for None.
    ValueError naming the bad value otherwise."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a logging level name or number, not {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{what} must be a logging level of at least 0, not {value!r}")
        return value
    if isinstance(value, str):
        level = logging.getLevelName(value.upper())
        if isinstance(level, int):
            return level
    raise ValueError(
        f"{what} must be a logging level name (DEBUG, INFO, WARNING, ERROR, CRITICAL) "
        f"or number, not {value!r}"
    )


def capture_level(job_class: type) -> int | None:
    """The level an attempt of ``job_class`` captures from: its ``log_level``; if that is
    None, ``GATOR_JOB_LOG_LEVEL``; None (no capture) if the class says False or neither
    sets one."""
    own = getattr(job_class, "log_level", None)
    if own is False:
        return None
    if own is not None:
        return level_of(own)
    return conf.job_log_level()


class _Formatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        moment = datetime.fromtimestamp(record.created, UTC)
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


_FORMATTER = _Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


class LogBuffer:
    """The captured lines of one attempt: the newest ``max_lines`` lines of at most
    ``max_bytes`` bytes in all (UTF-8), and how many older ones were dropped."""

    def __init__(self, level: int, *, max_lines: int, max_bytes: int) -> None:
        self.level = level
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self.lines: deque[str] = deque()
        self.size = 0
        self.dropped = 0
        self._lock = threading.Lock()

    def add(self, record: logging.LogRecord) -> None:
        """Format ``record`` and keep it, dropping the oldest lines beyond the bounds.
        Never raises: a record that cannot be formatted is kept as a note saying so."""
        try:
            line = _FORMATTER.format(record)
        except Exception as exc:
            line = f"(a {record.levelname} record of {record.name} could not be formatted: {exc!r})"
        line = storable(line)
        size = len(line.encode("utf-8"))
        if size > self.max_bytes:  # one line larger than the whole budget: its start
            line = line.encode("utf-8")[: max(self.max_bytes - len(CUT), 0)].decode(
                "utf-8", "ignore"
            )
            line += CUT
            size = len(line.encode("utf-8"))
        with self._lock:
            self.lines.append(line)
            self.size += size
            while len(self.lines) > self.max_lines or self.size > self.max_bytes:
                self.size -= len(self.lines.popleft().encode("utf-8"))
                self.dropped += 1

    def take(self) -> tuple[list[str], int]:
        """The lines kept and the count dropped, emptying the buffer."""
        with self._lock:
            lines, dropped = list(self.lines), self.dropped
            self.lines.clear()
            self.size = self.dropped = 0
        return lines, dropped

    def entry(self, *, attempt: int, worker: str, secrets: Sequence[str] = ()) -> dict[str, Any]:
        """The attempt's entry of the job's ``logs`` (emptying the buffer), its lines with
        ``secrets`` (the job's redacted values) masked as in error messages."""
        lines, dropped = self.take()
        if secrets:
            lines = [mask_text(line, secrets) for line in lines]
        return {
            "attempt": attempt,
            "worker": worker,
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "level": logging.getLevelName(self.level),
            "lines": lines,
            "dropped": dropped,
        }


def buffer_for(job_class: type) -> LogBuffer | None:
    """A buffer for an attempt of ``job_class``, or None when it captures nothing."""
    level = capture_level(job_class)
    if level is None:
        return None
    install()
    return LogBuffer(
        level,
        max_lines=conf.job_log_lines(),
        max_bytes=conf.job_log_bytes(),
    )


@contextmanager
def capturing(buffer: LogBuffer | None) -> Iterator[None]:
    """Send the records of this thread or task to ``buffer`` for the duration (nothing
    for None)."""
    if buffer is None:
        yield
        return
    token = _current.set(buffer)
    try:
        yield
    finally:
        _current.reset(token)
        _only.set(None)


def storable(text: str) -> str:
    """``text`` with NUL bytes and unpaired surrogates escaped, which no database stores."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def install() -> None:
    """Wrap ``Logger.isEnabledFor`` and ``Logger.handle`` once, so that records reach the
    buffer of the attempt running in this context (see the module's docstring)."""
    global _installed
    if _installed:
        return
    with _install_lock:
        if _installed:
            return
        enabled = logging.Logger.isEnabledFor
        handle = logging.Logger.handle

        def is_enabled_for(self: logging.Logger, level: int) -> bool:
            if enabled(self, level):
                return True
            buffer = _current.get()
            if buffer is None or level < buffer.level or self.disabled:
                return False
            if level <= self.manager.disable:  # logging.disable() applies to capture too
                return False
            _only.set((self, level))
            return True

        def handle_record(self: logging.Logger, record: logging.LogRecord) -> Any:
            buffer = _current.get()
            if buffer is None:
                return handle(self, record)
            only = _only.get()
            if only is not None:
                _only.set(None)
            if record.levelno >= buffer.level and not self.disabled:
                buffer.add(record)
            if only is not None and only[0] is self and only[1] == record.levelno:
                return None  # let through for capture alone
            return handle(self, record)

        logging.Logger.isEnabledFor = is_enabled_for  # type: ignore[method-assign]
        logging.Logger.handle = handle_record  # type: ignore[method-assign]
        _installed = True
