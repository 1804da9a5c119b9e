"""Long-running jobs: progress, checkpoints, heartbeats and stall detection, as a job sees
them (``self.progress()``, ``self.checkpoint()``, ``self.heartbeat()``,
``self.checkpoint_data``, ``self.each()``; see :class:`LongRunning`, which
:class:`~django_gator.queueable.Queueable` inherits).

An attempt run by a worker (or by ``run_jobs()`` / ``GATOR_IMMEDIATE``) has a
:class:`Journal`: it keeps the latest progress and checkpoint in memory and writes them
to the job's row at most once per ``GATOR_PROGRESS_INTERVAL`` seconds (the first call of
an attempt writes at once), and once more when the attempt ends, before its outcome is
written. Each write is one UPDATE, a compare-and-set on the claim: a job taken over by a
rescue is never written by its old runner. The worker gives the journal its write and
read functions (see :mod:`django_gator.worker.progress`), so this module loads no
database code. Without a journal (a job instance made by hand) every call is kept in
memory only.

A progress write that fails is logged and dropped: it never fails the job. A checkpoint
write that fails is logged and kept, to be tried at the next write.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

from django_gator.exceptions import HandBack
from django_gator.joblogs import LogBuffer, level_of
from django_gator.validation import check_json

logger = logging.getLogger("django_gator.worker")

T = TypeVar("T")

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


class LongRunning:
    """What a job calls while it runs long (mixed into Queueable): see the README's
    "Long-running jobs".

    ``stall_timeout``: seconds the job may go without calling :meth:`progress`,
    :meth:`checkpoint` or :meth:`heartbeat` before its attempt fails with
    :class:`~django_gator.exceptions.JobStalled` (None: never).

    ``log_level``: the level from which the log records an attempt emits are captured
    and kept with it (see :mod:`django_gator.joblogs`): a name (``"INFO"``) or a number;
    None follows ``GATOR_JOB_LOG_LEVEL``; False captures nothing, whatever the setting."""

    stall_timeout: ClassVar[float | None] = None
    log_level: ClassVar[str | int | bool | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.log_level is not False:
            level_of(cls.log_level, f"{cls.__qualname__}.log_level")

    #: Set by the worker for each attempt it runs.
    _gator_journal: Journal | None = None

    def _journal(self) -> Journal:
        if self._gator_journal is None:  # a job made by hand: kept in memory only
            self._gator_journal = Journal(lambda p, c, g: True, lambda: None, interval=math.inf)
        return self._gator_journal

    def progress(self, done: float, total: float | None = None, note: str = "") -> None:
        """Report how far the job is: ``done`` of ``total`` (None: unknown), with a short
        ``note``. Shown in the admin, ``gator_status`` and the metrics; written at most
        once per ``GATOR_PROGRESS_INTERVAL`` seconds (and when the attempt ends), so call
        it as often as you like. Never raises: a bad value is logged and dropped."""
        try:
            done = float(done) if not isinstance(done, int) else done
            if total is not None:
                total = float(total) if not isinstance(total, int) else total
            self._journal().progress(done, total, str(note))
        except (TypeError, ValueError) as exc:
            logger.warning("progress() ignored: %s", exc)

    def checkpoint(self, state: Any) -> None:
        """Save ``state`` (any JSON value) for the next attempt of this job to resume from
        (see :attr:`checkpoint_data`). Kept in memory and written with the progress: at
        most ``GATOR_PROGRESS_INTERVAL`` seconds after this call (at the next call after
        that interval) and always when the attempt ends, before its outcome. Inside an
        atomic job's transaction it commits or rolls back with the job. TypeError if
        ``state`` is not JSON."""
        self._journal().checkpoint(state)

    def heartbeat(self) -> None:
        """Say "still alive" to the stall watch (``stall_timeout``); writes nothing."""
        self._journal().touch()

    @property
    def checkpoint_data(self) -> Any:
        """The state of the last checkpoint written by an earlier attempt of this job (the
        one this attempt resumes from), or None on a fresh start. Read from the database
        once, on first use; this attempt's own checkpoint() calls do not change it."""
        return self._journal().start_state()

    def each(self, items: Iterable[T], *, cursor: str = "each", chunk: int = 500) -> Iterator[T]:
        """Iterate ``items``, resuming where an earlier attempt stopped, checkpointing as it
        goes and reporting progress.

        ``items``: a list (or any sequence: its position is the index of the next item)
        or a Django queryset (iterated by primary key in ``chunk``-sized keyset queries,
        whatever its ordering; its position is the last primary key done; sync handlers
        only). The position is kept under the key ``cursor`` of a dict checkpoint, so a
        job may run several loops, or keep more state with :meth:`checkpoint` (pass a
        dict; each() merges its key in). After each item's body has run, its position
        is recorded (written per :meth:`checkpoint`'s schedule); when the worker is
        stopping (SIGTERM) each() writes it and raises
        :class:`~django_gator.exceptions.HandBack`, which gives the job back to
        ``waiting`` at once: the next attempt starts at the next item. After a crash,
        the items of at most the last ``GATOR_PROGRESS_INTERVAL`` seconds run again."""
        journal = self._journal()
        state = journal.start_state()
        if state is not None and not isinstance(state, dict):
            raise TypeError(f"each() keeps its position in a dict checkpoint, not {state!r}")
        position = (state or {}).get(cursor)
        if hasattr(items, "model") and hasattr(items, "filter"):
            return self._each_row(items, cursor, position, chunk)
        return self._each_item(items, cursor, position or 0)

    def _mark(self, cursor: str, position: Any) -> None:
        journal = self._journal()
        state = journal.state
        self.checkpoint({**(state if isinstance(state, dict) else {}), cursor: position})

    def _each_item(self, items: Iterable[T], cursor: str, start: int) -> Iterator[T]:
        sequence: Sequence[T] = items if isinstance(items, Sequence) else list(items)
        total = len(sequence)
        journal = self._journal()
        for index in range(start, total):
            yield sequence[index]
            self._mark(cursor, index + 1)
            self.progress(index + 1, total=total, note=cursor)
            if journal.stopping():
                raise HandBack(f"the worker is stopping; {cursor} handed back at {index + 1}")

    def _each_row(self, queryset: Any, cursor: str, after: Any, chunk: int) -> Iterator[Any]:
        total = queryset.count()
        done = 0 if after is None else queryset.filter(pk__lte=after).count()
        journal = self._journal()
        while True:
            page = queryset.order_by("pk")
            if after is not None:
                page = page.filter(pk__gt=after)
            rows = list(page[:chunk])
            if not rows:
                return
            for row in rows:
                yield row
                after = row.pk
                done += 1
                self._mark(cursor, after)
                self.progress(done, total=total, note=cursor)
                if journal.stopping():
                    raise HandBack(f"the worker is stopping; {cursor} handed back after {after}")
