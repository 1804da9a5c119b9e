"""What an error looks like in a job's row: one entry of its error history (class,
message, traceback, attempt, worker) and the one-line ``last_error``.

Whatever a job raised can be recorded: a ``__str__`` that raises, NUL bytes (which
PostgreSQL text cannot hold) and unpaired surrogates (which no database's UTF-8 can) are
escaped, and the entry says so. Tracebacks are cut to ``GATOR_MAX_TRACEBACK_CHARS``.
"""

from __future__ import annotations

import traceback
from datetime import UTC, datetime
from typing import Any

from django_gator import conf
from django_gator.encryption import SHOWN
from django_gator.engines.base import ClaimedJob
from django_gator.logutil import safe
from django_gator.redaction import is_encrypted, mask_text, secret_values
from django_gator.validation import dumps

LAST_ERROR_CHARS = 1000
MESSAGE_CHARS = 4000


def qualified_name(exc: BaseException) -> str:
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def error_entry(
    exc: BaseException,
    *,
    attempt: int,
    worker_id: str,
    tb: str | None = None,
    extra: dict[str, Any] | None = None,
    note: str | None = None,
) -> tuple[str, str]:
    """(JSON of one error-history entry, the one-line summary for ``last_error``).
    ``extra``: more keys for the entry (``{"outage": True}``); ``note``: a sentence for
    whoever reads the history.

    Whatever a job raised can be recorded: a ``__str__`` that raises, NUL bytes (which
    PostgreSQL text cannot hold) and unpaired surrogates (which no database's UTF-8 can)
    are escaped, and the entry says so."""
    message, message_note = exception_text(exc)
    if tb is None:
        try:
            tb = "".join(traceback.format_exception(exc))
        except Exception:  # a traceback object or a __notes__ entry that cannot be rendered
            tb = f"(the traceback could not be rendered)\n{qualified_name(exc)}\n"
    limit = conf.max_traceback_chars()
    if len(tb) > limit:
        tb = tb[: limit // 2] + "\n...\n" + tb[-limit // 2 :]
    tb, tb_changed = storable(tb)
    cls, cls_changed = storable(qualified_name(exc))
    entry: dict[str, Any] = {
        "attempt": attempt,
        "at": datetime.now(UTC).isoformat(),
        "worker": worker_id,
        "class": cls,
        "message": message[:MESSAGE_CHARS],
        "traceback": tb,
        **(extra or {}),
    }
    notes = [n for n in (note, message_note) if n]
    if tb_changed or cls_changed:
        notes.append(SANITIZED_NOTE)
    if notes:
        entry["note"] = "; ".join(dict.fromkeys(notes))
    summary = f"{cls}: {message}" if message else cls
    return dumps(entry), summary[:LAST_ERROR_CHARS]


#: Said in an error entry whose text had characters a database cannot store.
SANITIZED_NOTE = "NUL bytes or unpaired surrogates in the error were escaped to store it"


def exception_text(exc: BaseException) -> tuple[str, str | None]:
    """The message of ``exc`` as storable text, and a note when it had to be changed."""
    try:
        raw: str | None = str(exc)
    except Exception:
        raw = None
    if raw is None:
        try:
            fallback = repr(exc.args)
        except Exception:
            fallback = "?"
        text, _ = storable(f"<str() of the exception raised; its args: {fallback}>")
        return text, "the exception's __str__ raised, so its args are shown instead"
    text, changed = storable(raw)
    return text, SANITIZED_NOTE if changed else None


def storable(text: str) -> tuple[str, bool]:
    """``text`` with NUL bytes and unpaired surrogates escaped (``\\x00``,
    ``\\udc80``); True as the second item if anything changed."""
    changed = False
    if "\x00" in text:
        text, changed = text.replace("\x00", "\\x00"), True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text, changed = text.encode("utf-8", "backslashreplace").decode("utf-8"), True
    return text, changed


def loggable_traceback(job: ClaimedJob, exc: BaseException) -> str:
    """The traceback of an exception raised by a job's hook, as one log-safe line: the
    job's secrets masked, control characters escaped (user code may have put the payload
    into its message). An encrypted job's: its exception's class only."""
    if is_encrypted(job.name):
        return f"{qualified_name(exc)}: {SHOWN}"
    text = "".join(traceback.format_exception(exc))
    secrets = secret_values(job.name, job.args, job.kwargs)
    return safe(mask_text(text, secrets), conf.max_traceback_chars())


def age_seconds(created_at: Any) -> float | None:
    """Seconds since ``created_at`` (a datetime, or SQLite's text), by this clock."""
    if created_at is None:
        return None
    if isinstance(created_at, str):
        from django.utils.dateparse import parse_datetime

        created_at = parse_datetime(created_at)
        if created_at is None:
            return None
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=UTC)
    return max((datetime.now(UTC) - created_at).total_seconds(), 0.0)
