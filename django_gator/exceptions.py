"""The exceptions django-gator raises, all under :class:`GatorError`."""

from __future__ import annotations

from django.db import OperationalError


class GatorError(Exception):
    """Base class of every error raised by django-gator itself."""


class JobNotRegistered(GatorError, LookupError):
    """A job name that is not in the registry (a row from an older deploy, or a typo)."""

    def __init__(self, name: str, suggestions: list[str] | None = None) -> None:
        self.name = name
        self.suggestions = suggestions or []
        message = f"job name {name!r} is not registered"
        if self.suggestions:
            message += "; did you mean " + " or ".join(repr(s) for s in self.suggestions) + "?"
        super().__init__(message)


class AlreadyRegistered(GatorError):
    """Two different classes tried to register under one job name."""


class PayloadTooLarge(GatorError, ValueError):
    """The JSON payload of a job is larger than ``GATOR_MAX_PAYLOAD_BYTES``."""


class JobTimeout(GatorError):
    """A job ran longer than its ``timeout``."""


class WorkerLost(GatorError):
    """The worker running a job stopped heartbeating (killed, frozen or cut off)."""


class JobCancelled(GatorError):
    """Raised by a job (usually after ``self.cancel_requested()`` said so) to stop early:
    the job ends ``cancelled``, with no retry."""


class TransactionLeftOpen(GatorError):
    """A job returned with a database transaction still open (a raw ``BEGIN``, an
    ``atomic()`` never left, ``set_autocommit(False)``). The worker rolled it back, so the
    job's uncommitted writes are gone, and the attempt fails."""


class SchemaMissing(GatorError):
    """django-gator's tables are not in the database: ``manage.py migrate`` has not run."""


class DispatchDeadlock(GatorError, OperationalError):
    """A dispatch inside the caller's ``transaction.atomic()`` lost a deadlock: the database
    rolled back the caller's whole transaction, so only the caller can run it again."""
