"""Deferred inserts: jobs (or a workflow) inserted when the caller's transaction on another
alias commits (``on_commit``). By then the caller's data is committed and nobody can catch
an error, so the INSERT is retried, and what still cannot be inserted is logged whole
(secrets masked) for an operator to re-create, and ``dispatch_failed`` is sent."""

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

if TYPE_CHECKING:
    from django_gator.models import Job
    from django_gator.pipeline.core import Insert

logger = logging.getLogger("django_gator.dispatch")


def defer(
    insert: Insert,
    commit_alias: str,
    write: Callable[[], list[Job]],
    announce: Callable[[list[Job]], None],
) -> None:
    """Run ``write`` (the pipeline's INSERT of ``insert``), then ``announce`` with the
    jobs it created, when the transaction of ``commit_alias`` commits.

    By then the caller's data is committed and nobody can catch our error: the INSERT is
    tried again (``GATOR_DISPATCH_ON_COMMIT_RETRY_DELAYS``), reconnecting, and if it still
    fails what it would have inserted is logged so that an operator can re-create it, and
    ``dispatch_failed`` is sent. The callback never raises for the insert, and it is
    registered ``robust`` so that the caller's later on_commit callbacks run whatever
    happens. (With GATOR_IMMEDIATE, a test setting, a job that ends dead raises here on
    purpose, as it does from any dispatch; that one is not robust.)"""
    delays = conf.dispatch_on_commit_retry_delays()  # a bad setting fails the dispatch now

    def insert_on_commit() -> None:
        created = _write_deferred(insert, delays, write)
        if created is not None:
            announce(created)

    transaction.on_commit(insert_on_commit, using=commit_alias, robust=not conf.immediate())


def _write_deferred(
    insert: Insert, delays: list[float], write: Callable[[], list[Job]]
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
                connection = connections[insert.alias]
                # Inside an open transaction of the jobs database (the caller's), a failed
                # statement cannot be tried again alone.
                if tries > len(delays) or connection.in_atomic_block:
                    break
                logger.warning(
                    "Deferred dispatch failed; retrying name=%s count=%s try=%s delay=%s error=%s",
                    safe(insert.name),
                    len(insert),
                    tries,
                    delays[tries - 1],
                    error_text(error, insert),
                )
                with contextlib.suppress(DatabaseError):
                    connection.close()  # the next try opens a new connection
                time.sleep(delays[tries - 1])
    except Exception as exc:
        error = exc
    _report_lost(insert, tries, error)
    return None


def _report_lost(insert: Insert, tries: int, error: BaseException) -> None:
    """Log what a deferred insert could not write, with what re-creates it (secrets
    masked, as everywhere in logs), and send ``dispatch_failed``."""
    try:
        insert.report_lost(tries, error_text(error, insert))
    except Exception:
        logger.exception(
            "Deferred dispatch lost: jobs not inserted name=%s count=%s (their arguments "
            "could not be logged)",
            safe(insert.name),
            len(insert),
        )
    for sender, jobs in insert.lost():
        signals.send(signals.dispatch_failed, sender, jobs=jobs, exception=error)


def error_text(error: BaseException, insert: Insert) -> str:
    """``error`` for a log line: the secrets in the insert's arguments masked, cut."""
    secrets = sorted(
        {s for payload in insert.payloads() for s in redaction.secret_values(*payload)},
        key=len,
        reverse=True,
    )
    return safe(redaction.mask_text(f"{type(error).__name__}: {error}", secrets), limit=1000)


def log_json(value: Any) -> str:
    """JSON on one line: every control and non-ASCII character escaped, so it can neither
    forge a log line nor be cut; ``json.loads`` of it gives the value back."""
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))
