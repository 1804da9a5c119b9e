"""The compare-and-set of each kind of outcome (a success, an atomic job's, a snooze, a
failure), with the check that tells a lost claim from a lost answer, and the log lines.

Each write changes the job's row only while the claim (job id, attempt, worker id) still
holds. When it changes no row, :meth:`OutcomeWrites.landed` asks whether an earlier try of
the same write committed before its answer was lost; otherwise the outcome is discarded
and logged (:func:`log_lost`). :class:`~.outcomes.Outcomes` decides which write an outcome
takes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

from django.db import DatabaseError

from django_gator.attempts import Claim, Failure, Mark, Snoozed, Success
from django_gator.engines import ClaimedJob, JobEngine
from django_gator.logutil import safe
from django_gator.redaction import mask_text, secret_values
from django_gator.states import JobState
from django_gator.tallies import Tally
from django_gator.worker.errors import LAST_ERROR_CHARS
from django_gator.worker.execution import unstorable_failure

logger = logging.getLogger("django_gator.worker")

T = TypeVar("T")


class Retrying(Protocol):
    """Runs a database operation, retrying while the database is unreachable; None if it
    gave up (see :class:`~django_gator.worker.retrier.Retrier`)."""

    def __call__(self, what: str, action: Callable[[], T]) -> T | None: ...


def _once(what: str, action: Callable[[], T]) -> T | None:
    return action()


class OutcomeWrites:
    """The writes of one worker's outcomes (``worker_id``'s claims), each a compare-and-set
    on the claim, retried by ``retrying`` while the database is unreachable."""

    def __init__(
        self,
        engine: JobEngine,
        worker_id: str,
        retrying: Retrying | None = None,
        follow_ups: list[int] | None = None,
    ) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.retrying: Retrying = retrying or _once
        #: Where the ids of the rows an outcome inserted (workflow steps it released, an
        #: on_error handler) are collected, if the caller wants them.
        self.follow_ups = follow_ups
        #: The outcomes written, counted per minute and queue (django_gator.tallies).
        self.tally = Tally()

    def landed(self, job: ClaimedJob, expected: str, *, given_back: bool = False) -> bool:
        """After a compare-and-set changed no row: did an earlier try of this very write
        commit (the connection broke before we saw the answer)? ``given_back``: the write
        gave the attempt back (a snooze), so the row has one attempt fewer."""
        state = self.retrying(f"read job {job.id}", lambda: self.engine.claim_state(job.id))
        attempts = job.attempts - 1 if given_back else job.attempts
        if state is None or state[1:] != (attempts, self.worker_id):
            return False
        # A failure turns into "cancelled" when a cancellation was asked for.
        return state[0] == expected or (
            expected != JobState.SUCCEEDED and state[0] == JobState.CANCELLED
        )

    # -- the writes ------------------------------------------------------------------------
    def _success(self, job: ClaimedJob, outcome: Success, elapsed_ms: float) -> str | None:
        """A success written on its own; for a workflow step, with the release of the
        steps that waited for it in the same transaction."""
        written = self.retrying(
            f"record success of job {job.id}",
            lambda: self.engine.with_steps(
                step_ids(job),
                self.follow_ups,
                lambda: self.engine.mark_succeeded_and_insert(
                    self.worker_id,
                    Mark.of(job, outcome.result),
                    [],
                    self.follow_ups,
                ),
            ),
        )
        if written is None:
            return None
        if not written and not self.landed(job, JobState.SUCCEEDED):
            log_lost(job, JobState.SUCCEEDED)
            return None
        if logger.isEnabledFor(logging.INFO):
            log_success(job, elapsed_ms, workflow_part(job))
        return JobState.SUCCEEDED.value

    def _atomic(self, job: ClaimedJob, outcome: Success, elapsed_ms: float) -> str | None:
        """An atomic job's success, already written with its transaction (or not)."""
        if not outcome.written:
            # The mark found the job taken back (rescued, or cancelled by an operator): the
            # job's transaction rolled back, so its effects are undone, and whoever holds
            # the job now decides what happens to it.
            logger.warning(
                "Lost job; its transaction rolled back id=%s name=%s attempt=%s worker=%s",
                job.id,
                safe(job.name),
                job.attempts,
                self.worker_id,
            )
            return None
        log_success(job, elapsed_ms, " atomic=yes")
        return JobState.SUCCEEDED.value

    def _snoozed(self, job: ClaimedJob, outcome: Snoozed, elapsed_ms: float) -> str | None:
        """Back to waiting, due later, the attempt given back (``cancelled`` instead if a
        cancellation was asked for meanwhile). Nothing follows in a chain: the step waits."""
        written = self.retrying(
            f"record snooze of job {job.id}",
            lambda: self.engine.with_steps(
                step_ids(job),
                self.follow_ups,
                lambda: self.engine.mark_snoozed(self.worker_id, Claim.of(job), outcome.seconds),
            ),
        )
        if written is None:
            return None
        if not written and not self.landed(job, JobState.WAITING, given_back=True):
            log_lost(job, JobState.WAITING)
            return None
        logger.info(
            "Processed job id=%s name=%s result=snoozed queue=%s attempt=%s duration_ms=%.1f "
            "snoozed_s=%g",
            job.id,
            safe(job.name),
            safe(job.queue),
            job.attempts,
            elapsed_ms,
            outcome.seconds,
        )
        # As for a failure, a cancellation asked for meanwhile makes the row ``cancelled``.
        return JobState.WAITING.value

    def _failure(self, job: ClaimedJob, outcome: Failure, elapsed_ms: float) -> str | None:
        result = outcome.state

        def write(failure: Failure) -> bool | None:
            return self.retrying(
                f"record failure of job {job.id}",
                lambda: self.engine.with_steps(
                    step_ids(job),
                    self.follow_ups,
                    lambda: self.engine.mark_failed_and_insert(
                        self.worker_id, Claim.of(job), failure, [], self.follow_ups
                    ),
                ),
            )

        try:
            written = write(outcome)
        except DatabaseError as exc:
            # The database refused this entry (retrying cannot help): record the failure
            # with an entry that says what was refused instead.
            logger.exception("The failure of job id=%s could not be stored as is", job.id)
            outcome = unstorable_failure(outcome, exc, attempt=job.attempts, worker=self.worker_id)
            written = write(outcome)
        if written is None:
            return None
        if not written and not self.landed(job, result, given_back=outcome.uncharged):
            log_lost(job, result)
            return None
        logger.warning(
            "Processed job id=%s name=%s result=%s queue=%s attempt=%s duration_ms=%.1f%s error=%s",
            job.id,
            safe(job.name),
            result,
            safe(job.queue),
            # As the row holds it: an attempt given back is not counted.
            job.attempts - 1 if outcome.uncharged else job.attempts,
            elapsed_ms,
            failure_detail(job, outcome),
            # Whole (last_error is cut to LAST_ERROR_CHARS already): its end may be the fix.
            safe(
                mask_text(outcome.last_error, secret_values(job.name, job.args, job.kwargs)),
                LAST_ERROR_CHARS,
            ),
        )
        return result


def failure_detail(job: ClaimedJob, outcome: Failure) -> str:
    """The log line's words on a failure's attempt that was given back (not charged)."""
    if outcome.outage:
        return f" outage={job.outages + 1} retry_in_s={outcome.retry_in:g}"
    if outcome.uncharged:
        return f" charged=no retry_in_s={outcome.retry_in:g}"
    return ""


def step_ids(job: ClaimedJob) -> list[int]:
    """``[job.id]`` for a workflow step (whose final state settles its workflow), else
    nothing."""
    return [job.id] if job.chain_id is not None else []


def workflow_part(job: ClaimedJob) -> str:
    """The workflow part of a step's log line."""
    return f" workflow={job.chain_id}" if job.chain_id else ""


def log_success(job: ClaimedJob, elapsed_ms: float, extra: str = "") -> None:
    logger.info(
        "Processed job id=%s name=%s result=succeeded queue=%s attempt=%s duration_ms=%.1f%s",
        job.id,
        safe(job.name),
        safe(job.queue),
        job.attempts,
        elapsed_ms,
        extra,
    )


def log_lost(job: ClaimedJob, result: str) -> None:
    logger.warning(
        "Job outcome discarded: the claim was lost (rescued or changed meanwhile) "
        "id=%s name=%s result=%s",
        job.id,
        safe(job.name),
        result,
    )
