"""The journal of an attempt: its progress and checkpoint kept in memory and written to the
job's row at a bounded rate, its signs of life for the stall watch, and its captured log
lines, written once, by its last write (see :mod:`django_gator.longjobs` for what a job
calls, and :mod:`django_gator.worker.progress` for the writes the worker gives it)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django_gator.joblogs import LogBuffer
from django_gator.validation import check_json

logger = logging.getLogger("django_gator.worker")

#: Characters of a progress note kept.
NOTE_CHARS = 200
#: What :meth:`Journal.pending` holds when there is nothing to write.
_NOTHING: Any = object()

#: Writes (progress JSON or None, checkpoint JSON or None, captured-logs entry JSON or None)
#: on the claim; False if the claim is no longer this attempt's.
Write = Callable[[str | None, str | None, str | None], bool]


class Journal:
    """One attempt's progress and checkpoint, and when it last showed signs of life.

    ``write`` stores what is pending; ``load`` reads the checkpoint the attempt starts
    from (JSON text or None); ``interval``: seconds between two writes; ``stopping``:
    whether the worker is stopping (``each()`` hands the job back then); ``submit``: run a
    function off this thread (an async job's writes and reads go to the worker's writer
    threads, never on the event loop); ``on_progress(delta)``: items done since the last
    write, for the metrics; ``logs``: the attempt's captured log lines (see
    :mod:`django_gator.joblogs`), written once, by its last write, as the JSON text
    ``log_entry()`` makes of them."""

    def __init__(
        self,
        write: Write,
        load: Callable[[], str | None],
        *,
        interval: float,
        stopping: Callable[[], bool] = lambda: False,
        submit: Callable[[Callable[[], Any]], Any] | None = None,
        on_progress: Callable[[float], None] | None = None,
        logs: LogBuffer | None = None,
        log_entry: Callable[[], str] | None = None,
    ) -> None:
        self._write = write
        self.logs = logs if log_entry is not None else None
        self._log_entry = log_entry
        self._logs_written = False
        self._load = load
        self.interval = interval
        self.stopping = stopping
        self._submit = submit
        self._on_progress = on_progress
        self._lock = threading.Lock()
        #: Held from taking the pending values to their write: two writes of one attempt
        #: (an async job's, on two writer threads) land in the order they took them.
        self._write_lock = threading.Lock()
        #: time.monotonic() of the last progress(), checkpoint() or heartbeat(): what the
        #: stall watch reads (without the lock: a float is read whole).
        self.active_at = time.monotonic()
        self._written_at = -math.inf
        self._progress: dict[str, Any] | None = None
        self._checkpoint: Any = _NOTHING  # JSON text waiting to be written
        self._flushing = False  # an async journal's write is on its way
        self._first: tuple[float, float] | None = None  # (done, monotonic) at the first call
        self._counted = 0.0  # items counted in the metrics so far
        self._loaded = False
        self._start_state: Any = None
        #: The latest state given to checkpoint() (or loaded), for each() to merge into.
        self.state: Any = None
        #: Writes made, and refused (the claim was lost): for tests and the logs.
        self.writes = 0

    # -- what the job calls ------------------------------------------------------------------
    def touch(self) -> None:
        self.active_at = time.monotonic()

    def progress(self, done: float, total: float | None, note: str) -> None:
        now = time.monotonic()
        self.active_at = now
        if self._first is None:
            self._first = (done, now)
        first_done, first_at = self._first
        rate = (done - first_done) / (now - first_at) if now - first_at >= 1.0 else None
        value = {
            "done": done,
            "total": total,
            "note": note[:NOTE_CHARS],
            "rate": None if rate is None else round(rate, 3),
        }
        with self._lock:
            self._progress = value
        self._maybe_write(now)

    def checkpoint(self, state: Any) -> None:
        check_json(state, "checkpoint")
        text = json.dumps(state, separators=(",", ":"), ensure_ascii=False)
        if not self._loaded:
            self.start_state()  # read before this attempt's first write replaces it
        now = time.monotonic()
        self.active_at = now
        with self._lock:
            self._checkpoint = text
            self.state = state
        self._maybe_write(now)

    def start_state(self) -> Any:
        """The checkpoint this attempt started from (read once, on first use)."""
        if not self._loaded:
            text = self._submit(self._load).result() if self._submit else self._load()
            self._start_state = None if text is None else json.loads(text)
            with self._lock:
                if self._checkpoint is _NOTHING:
                    self.state = self._start_state
            self._loaded = True
        return self._start_state

    # -- writing -----------------------------------------------------------------------------
    def _maybe_write(self, now: float) -> None:
        if now - self._written_at < self.interval:
            return
        if self._submit is None:
            if not _on_event_loop():  # else kept for the write at the attempt's end
                self.flush(final=False)
            return
        with self._lock:
            if self._flushing:
                return
            self._flushing = True
        self._written_at = now
        try:
            self._submit(self._flush_between)
        except Exception as exc:  # the writer threads are gone (the worker stops)
            self._flushing = False
            logger.warning("Progress not written (kept): %s: %s", type(exc).__name__, exc)

    @property
    def pending(self) -> bool:
        """Whether a progress, a checkpoint or the captured logs wait to be written (or
        are being written)."""
        return (
            self._progress is not None
            or self._checkpoint is not _NOTHING
            or self._flushing
            or self.logs_pending
        )

    def relay(self, progress: str | None, checkpoint: str | None, logs: str | None) -> bool:
        """Write what an isolated attempt's journal (in its child process) sends, on this
        attempt's claim: a sign of life, counted in the metrics as this journal's own."""
        self.touch()
        with self._write_lock:
            written = self._write(progress, checkpoint, logs)
        self.writes += 1
        if written and progress is not None and self._on_progress is not None:
            done = json.loads(progress).get("done", 0)
            if self._first is None:
                self._first = (done, self.active_at)
            self._count(done)
        return written

    def read(self) -> str | None:
        """The checkpoint text this attempt starts from, read now (for a child's journal)."""
        return self._load()

    @property
    def logs_pending(self) -> bool:
        """Whether the attempt captured log lines that are not written yet."""
        logs = self.logs
        return logs is not None and not self._logs_written and bool(logs.lines or logs.dropped)

    def _flush_between(self) -> None:
        self.flush(final=False)

    def write_logs(self) -> None:
        """Write the captured logs alone, if not written yet (an atomic job's failed
        attempt, whose last write rolled back with it; an attempt the watchdog took).
        Never raises."""
        if not self.logs_pending:
            return
        with self._write_lock:
            entry = self._take_logs()
            try:
                self._write(None, None, entry)
            except Exception as exc:
                logger.warning("Job logs not written: %s: %s", type(exc).__name__, exc)

    def _take_logs(self) -> str | None:
        if not self.logs_pending or self._log_entry is None:
            return None
        self._logs_written = True
        return self._log_entry()

    def flush(self, *, final: bool = True) -> None:
        """Write what is pending, now, on this thread (the attempt's end does, before its
        outcome is written; ``final``: with the captured logs, which only the attempt's
        end writes). Never raises. ``pending`` stays true until the write is done:
        an async job's end, seeing a write in flight on a writer thread, waits for it
        before its outcome (which would otherwise be written first, and the checkpoint's
        compare-and-set then find the claim gone: its retry started from the beginning)."""
        with self._write_lock:
            try:
                self._flush(self._take_logs() if final else None)
            finally:
                with self._lock:
                    self._flushing = False

    def _flush(self, logs: str | None) -> None:
        with self._lock:
            progress, self._progress = self._progress, None
            checkpoint, self._checkpoint = self._checkpoint, _NOTHING
        self._written_at = time.monotonic()
        if progress is None and checkpoint is _NOTHING and logs is None:
            return
        if progress is not None:  # when it is written: at most an interval after the call
            progress["at"] = datetime.now(UTC).isoformat(timespec="seconds")
        text = None if progress is None else json.dumps(progress, separators=(",", ":"))
        try:
            written = self._write(text, None if checkpoint is _NOTHING else checkpoint, logs)
        except Exception as exc:
            logger.warning("Progress not written (dropped): %s: %s", type(exc).__name__, exc)
            if checkpoint is not _NOTHING:
                with self._lock:  # tried again at the next write, unless replaced
                    if self._checkpoint is _NOTHING:
                        self._checkpoint = checkpoint
            return
        self.writes += 1
        if written and progress is not None and self._on_progress is not None:
            self._count(progress["done"])

    def _count(self, done: float) -> None:
        first = self._first[0] if self._first else done
        delta = done - first - self._counted
        if delta > 0:
            self._counted += delta
            self._on_progress(delta)  # type: ignore[misc]


def _on_event_loop() -> bool:
    """Whether this thread runs an event loop: an async handler awaited outside the
    worker's loop (run_jobs(), GATOR_IMMEDIATE), where no database call may be made."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
