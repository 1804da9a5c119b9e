"""Deferred dispatch: jobs inserted when the caller's transaction on another alias commits
(``on_commit``). By then the caller's data is committed and nobody can catch an error, so
the INSERT is retried, and a job that still cannot be inserted is logged whole (secrets
masked) for an operator to re-create, and ``dispatch_failed`` is sent."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, transaction

from django_gator import conf, redaction, signals
from django_gator.logutil import safe
from django_gator.models import Job
from django_gator.rows import JobRows

if TYPE_CHECKING:
    from django_gator.queueable import Queueable

logger = logging.getLogger("django_gator.dispatch")


def defer(
    job_class: type[Queueable],
    alias: str,
    rows: JobRows,
    jobs: list[Job],
    commit_alias: str,
    write: Callable[[], list[Job]],
    announce: Callable[[list[Job]], None],
) -> None:
    """Insert the jobs when the transaction of ``commit_alias`` commits.

    By then the caller's data is committed and nobody can catch our error: the INSERT is
    tried again (``GATOR_DISPATCH_ON_COMMIT_RETRY_DELAYS``), reconnecting, and if it still
    fails every job is logged so that an operator can re-create it, and ``dispatch_failed``
    is sent. The callback never raises for the insert, and it is registered ``robust`` so
    that the caller's later on_commit callbacks run whatever happens. (With
    GATOR_IMMEDIATE, a test setting, a job that ends dead raises here on purpose, as it does
    from any dispatch; that one is not robust.)"""
    delays = conf.dispatch_on_commit_retry_delays()  # a bad setting fails the dispatch now

    def insert_on_commit() -> None:
        created = _write_deferred(job_class, alias, rows, jobs, delays, write)
        if created is not None:
            announce(created)

    transaction.on_commit(insert_on_commit, using=commit_alias, robust=not conf.immediate())


def _write_deferred(
    job_class: type[Queueable],
    alias: str,
    rows: JobRows,
    jobs: list[Job],
    delays: list[float],
    write: Callable[[], list[Job]],
) -> list[Job] | None:
    """``write()`` (the INSERT) with retries; the rows it created, or None once it gave up
    (reported). Never raises an Exception."""
    tries = 0
    error: BaseException
    try:
        while True:
            tries += 1
            try:
                return write()
            except DatabaseError as exc:
                error = exc
                connection = connections[alias]
                # Inside an open transaction of the jobs database (the caller's), a failed
                # statement cannot be tried again alone.
                if tries > len(delays) or connection.in_atomic_block:
                    break
                logger.warning(
                    "Deferred dispatch failed; retrying name=%s count=%s try=%s delay=%s error=%s",
                    safe(job_class.name),
                    len(rows),
                    tries,
                    delays[tries - 1],
                    _error_text(error, jobs),
                )
                with contextlib.suppress(DatabaseError):
                    connection.close()  # the next try opens a new connection
                time.sleep(delays[tries - 1])
    except Exception as exc:
        error = exc
    _report_lost(job_class, rows, jobs, tries, error)
    return None


def _report_lost(
    job_class: type[Queueable],
    rows: JobRows,
    jobs: list[Job],
    tries: int,
    error: BaseException,
) -> None:
    """Log each job that a deferred dispatch could not insert, with what re-creates it
    (secrets masked, as everywhere in logs), and send ``dispatch_failed``."""
    try:
        text = _error_text(error, jobs)
        for row, job in zip(rows.rows(), jobs, strict=True):
            args, kwargs = redaction.redact_payload(row.name, job.args, job.kwargs)
            logger.error(
                "Deferred dispatch lost: job not inserted name=%s queue=%s priority=%s "
                "run_at=%s args=%s kwargs=%s chain_id=%s tries=%s error=%s",
                safe(row.name),
                safe(row.queue),
                row.priority,
                row.run_at.isoformat() if row.run_at is not None else "now",
                _log_json(args),
                _log_json(kwargs),
                row.chain_id or "-",
                tries,
                text,
            )
    except Exception:
        logger.exception(
            "Deferred dispatch lost: job not inserted name=%s count=%s (its arguments could "
            "not be logged)",
            safe(job_class.name),
            len(rows),
        )
    signals.send(signals.dispatch_failed, job_class, jobs=jobs, exception=error)


def _error_text(error: BaseException, jobs: list[Job]) -> str:
    secrets = sorted(
        {s for job in jobs for s in redaction.secret_values(job.name, job.args, job.kwargs)},
        key=len,
        reverse=True,
    )
    return safe(redaction.mask_text(f"{type(error).__name__}: {error}", secrets), limit=1000)


def _log_json(value: Any) -> str:
    """JSON on one line: every control and non-ASCII character escaped, so it can neither
    forge a log line nor be cut; ``json.loads`` of it gives the value back."""
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))
