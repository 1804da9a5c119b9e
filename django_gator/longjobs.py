"""Long-running jobs: progress, checkpoints, heartbeats and stall detection, as a job sees
them (``self.progress()``, ``self.checkpoint()``, ``self.heartbeat()``,
``self.checkpoint_data``, ``self.each()``; see :class:`LongRunning`, which
:class:`~django_gator.queueable.Queueable` inherits).

An attempt run by a worker (or by ``run_jobs()`` / ``GATOR_IMMEDIATE``) has a journal
(:class:`~django_gator.journal.Journal`): it keeps the latest progress and checkpoint in
memory and writes them to the job's row at most once per ``GATOR_PROGRESS_INTERVAL``
seconds (the first call of an attempt writes at once), and once more when the attempt
ends, before its outcome is written. Each write is one UPDATE, a compare-and-set on the
claim: a job taken over by a rescue is never written by its old runner. The worker gives
the journal its write and read functions (see :mod:`django_gator.worker.progress`), so
this module loads no database code. Without a journal (a job instance made by hand) every
call is kept in memory only.

A progress write that fails is logged and dropped: it never fails the job. A checkpoint
write that fails is logged and kept, to be tried at the next write.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

from django_gator.exceptions import HandBack
from django_gator.joblogs import level_of
from django_gator.journal import Journal

logger = logging.getLogger("django_gator.worker")

T = TypeVar("T")

#: The values of a job class's ``isolation``.
ISOLATIONS = ("thread", "process")

__all__ = ["ISOLATIONS", "Journal", "LongRunning"]


class LongRunning:
    """What a job calls while it runs long (mixed into Queueable): see
    docs/guides/long-running.md.

    ``stall_timeout``: seconds the job may go without calling :meth:`progress`,
    :meth:`checkpoint` or :meth:`heartbeat` before its attempt fails with
    :class:`~django_gator.exceptions.JobStalled` (None: never).

    ``log_level``: the level from which the log records an attempt emits are captured
    and kept with it (see :mod:`django_gator.joblogs`): a name (``"INFO"``) or a number;
    None follows ``GATOR_JOB_LOG_LEVEL``; False captures nothing, whatever the setting."""

    stall_timeout: ClassVar[float | None] = None
    log_level: ClassVar[str | int | bool | None] = None
    #: "thread" (the default) or "process": each attempt in a child process of its own.
    isolation: ClassVar[str] = "thread"
    #: MiB of address space an isolated attempt may use (RLIMIT_AS); None: no limit.
    memory_limit: ClassVar[int | None] = None
    #: Seconds of CPU time an isolated attempt may use (RLIMIT_CPU); None: no limit.
    cpu_limit: ClassVar[int | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__qualname__
        if cls.log_level is not False:
            level_of(cls.log_level, f"{name}.log_level")
        if cls.isolation not in ISOLATIONS:
            raise ValueError(
                f'{name}.isolation must be "thread" or "process", not {cls.isolation!r}'
            )
        for attribute, unit in (("memory_limit", "MiB"), ("cpu_limit", "seconds")):
            value = getattr(cls, attribute)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(
                    f"{name}.{attribute} must be None or a whole number of {unit}, not {value!r}"
                )
        if cls.isolation == "process" and getattr(cls, "atomic", False):
            raise ValueError(
                f'{name}: an atomic job cannot have isolation = "process" (its success mark '
                "commits in its transaction, on the worker's connection)"
            )

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
