"""How an attempt ends, and the claims and marks that write it: the one vocabulary the
executor threads, the async runner, :class:`~django_gator.worker.outcomes.Outcomes` and the
engines share.

An attempt ends in one of three outcomes (like River's JobSetStateCompleted, ...Snoozed,
...ErrorRetryable, ...Discarded and ...Cancelled):

- :class:`Success`: ``handle()`` returned;
- :class:`Snoozed`: ``handle()`` raised :class:`~django_gator.exceptions.Snooze`;
- :class:`HandedBack`: ``self.each()`` gave the job back to a stopping worker;
- :class:`Failure`: anything else, retried or not (see its named constructors).

Each says how metrics and traces name it: its ``label`` is ``succeeded``, ``snoozed``,
``failed`` (will retry), ``dead`` or ``cancelled``. What travels to the engine is a
:class:`Mark` (a success to write on its claim) or a :class:`Claim` (a claim to fail,
snooze or give back), each carrying the job's batch id when it has one, as the engine
settles the batch in the same transaction.

A leaf of the package: it imports the job states and nothing else of django_gator, so
every layer can speak it. The outcomes are frozen; the marks and claims are NamedTuples,
as every job of a drain gets one and the engines read them by the column.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from django_gator.states import JobState

if TYPE_CHECKING:
    from django_gator.exceptions import Snooze
    from django_gator.rows import ClaimedJob


@dataclass(frozen=True, slots=True)
class Success:
    """``handle()`` returned: the job ends ``succeeded``."""

    result: str | None  # JSON, or None for a None / non-JSON return value
    #: Atomic jobs: True if the success mark committed with handle()'s transaction, False
    #: if the claim was lost and the transaction rolled back; None for other jobs (their
    #: mark is written afterwards, on its own or batched with others).
    written: bool | None = None

    @property
    def label(self) -> str:
        return JobState.SUCCEEDED.value


@dataclass(frozen=True, slots=True)
class Snoozed:
    """``handle()`` raised :class:`~django_gator.exceptions.Snooze`: the job goes back to
    ``waiting``, due ``seconds`` from now, its attempt given back, no error recorded."""

    seconds: float
    exception: Snooze

    @property
    def label(self) -> str:
        return "snoozed"


@dataclass(frozen=True, slots=True)
class HandedBack:
    """``handle()`` raised :class:`~django_gator.exceptions.HandBack` (``self.each()``
    does when the worker stops): the job goes back to ``waiting`` at once, its attempt
    given back and counted in ``handbacks``, never charged; its checkpoint was written
    before this outcome is."""

    exception: BaseException

    @property
    def label(self) -> str:
        return "handed_back"


@dataclass(frozen=True, slots=True)
class Failure:
    """The attempt failed: what to write. Build one with the constructor that says how it
    ends (:meth:`retry`, :meth:`discard`, :meth:`cancel`, :meth:`give_back`)."""

    dead: bool
    retry_in: float | None  # seconds from now (database time) to the retry; None: no retry
    queue: str
    error: str  # one error-history entry, as JSON
    last_error: str
    cancelled: bool = False  # the job raised JobCancelled: end it ``cancelled``
    exception: BaseException | None = None  # what was raised (not written; for signals)
    #: The attempt is given back (attempts - 1): the job never ran (its name is unknown
    #: to this worker, which may run older code than the dispatcher), or the database
    #: went away under it (``outage``).
    uncharged: bool = False
    #: The attempt was cut short by a lost database connection: counted in ``outages``.
    outage: bool = False
    #: The attempt was cut by a stopping worker and is charged for it (see
    #: Outcomes.hand_back): the row's ``handbacks`` goes up by one with this write.
    handback: bool = False

    @classmethod
    def retry(
        cls,
        queue: str,
        error: str,
        last_error: str,
        *,
        after: float,
        exception: BaseException | None = None,
    ) -> Failure:
        """The job's policy retries it (in ``queue``), ``after`` seconds from now; the
        attempt is charged."""
        return cls(False, after, queue, error, last_error, exception=exception)

    @classmethod
    def discard(
        cls, queue: str, error: str, last_error: str, *, exception: BaseException | None = None
    ) -> Failure:
        """No retry: the job ends ``dead``."""
        return cls(True, None, queue, error, last_error, exception=exception)

    @classmethod
    def cancel(
        cls, queue: str, error: str, last_error: str, *, exception: BaseException | None = None
    ) -> Failure:
        """The job raised JobCancelled: it ends ``cancelled``, whatever its policy."""
        return cls(False, None, queue, error, last_error, cancelled=True, exception=exception)

    @classmethod
    def give_back(
        cls,
        queue: str,
        error: str,
        last_error: str,
        *,
        after: float,
        outage: bool = False,
        exception: BaseException | None = None,
    ) -> Failure:
        """Not the job's fault: tried again ``after`` seconds from now, the attempt given
        back (an unknown job name; with ``outage``, a lost database connection)."""
        return cls(
            False,
            after,
            queue,
            error,
            last_error,
            exception=exception,
            uncharged=True,
            outage=outage,
        )

    def charging_handback(self) -> Failure:
        """This failure, written as the charged hand-back of a stopping worker."""
        return dataclasses.replace(self, handback=True)

    def with_error(self, error: str, last_error: str) -> Failure:
        """This failure with another error entry (one the database can store)."""
        return dataclasses.replace(self, error=error, last_error=last_error)

    @property
    def state(self) -> str:
        """The state the write gives the row, unless a cancellation was asked for
        meanwhile (then ``cancelled``)."""
        if self.cancelled:
            return JobState.CANCELLED.value
        return (JobState.DEAD if self.dead else JobState.FAILED).value

    @property
    def label(self) -> str:
        return self.state


#: Every outcome of an attempt.
Outcome = Success | Failure | Snoozed | HandedBack


class Mark(NamedTuple):
    """A success to write on its claim (``id``, ``attempts``): the compare-and-set finds
    the row by id and writes only if it still holds that attempt of this worker."""

    id: int
    attempts: int
    result: str | None = None  # JSON
    #: The job's batch, settled in the mark's transaction; None for a job of no batch.
    batch_id: int | None = None

    @classmethod
    def of(cls, job: ClaimedJob, result: str | None) -> Mark:
        # tuple.__new__: a NamedTuple's own __new__ (keywords, defaults) costs about a
        # microsecond more, and every job of a drain gets a mark.
        return tuple.__new__(cls, (job.id, job.attempts, result, job.batch_id))


class Claim(NamedTuple):
    """A claim of this worker's (``id``, ``attempts``): what a failure, a snooze or a
    release (back to ``waiting``, the attempt not charged) is written on, by the same
    compare-and-set as a :class:`Mark`."""

    id: int
    attempts: int
    #: The job's batch, settled in the write's transaction; None for a job of no batch.
    batch_id: int | None = None

    @classmethod
    def of(cls, job: ClaimedJob) -> Claim:
        return tuple.__new__(cls, (job.id, job.attempts, job.batch_id))


def batches_of(items: Iterable[Mark | Claim]) -> list[int]:
    """The batch ids ``items`` carry, sorted (the order batch rows are locked in)."""
    return sorted({item.batch_id for item in items if item.batch_id is not None})
