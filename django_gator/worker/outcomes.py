"""Writing an attempt's outcome: the only code that does.

Every outcome is a compare-and-set on the claim (job id, attempt, worker id), so a worker
that lost its claim meanwhile (rescued after a stall, cancelled by an operator) writes
nothing over the job's new life (each write, and how a write that changed no row is told
from one whose answer was lost, is in :mod:`.writes`).

The threaded worker, immediate mode and :func:`django_gator.testing.run_jobs` all write
through :class:`Outcomes`. The worker passes a ``retrying`` function (see
:class:`~django_gator.worker.retrier.Retrier`) so writes outlast a database restart;
inline runs write once and let errors reach their caller.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence

from django_gator import conf, metrics
from django_gator.attempts import Claim, Failure, HandedBack, Mark, Outcome, Snoozed, Success
from django_gator.engines import ClaimedJob
from django_gator.exceptions import JobHandedBack, JobStalled, JobTimeout
from django_gator.queueable import effective_timeout, get_job_class
from django_gator.states import JobState
from django_gator.worker.execution import failure_for
from django_gator.worker.retrier import refused
from django_gator.worker.writes import (
    OutcomeWrites,
    log_lost,
    log_success,
    step_ids,
    workflow_part,
)

logger = logging.getLogger("django_gator.worker")

#: What :meth:`Outcomes.record` returns for a plain success left for the batched mark.
DEFERRED = "deferred"


def has_steps(batch: Sequence[tuple[ClaimedJob, Success, float]]) -> bool:
    return any(job.chain_id is not None for job, _, _ in batch)


class Outcomes(OutcomeWrites):
    """Writes the outcomes of one worker's attempts (``worker_id``'s claims): which write
    each outcome takes, the batched successes, and the claims given back."""

    # -- one attempt -----------------------------------------------------------------------
    def record(
        self, job: ClaimedJob, outcome: Outcome, elapsed_ms: float, *, batch: bool
    ) -> str | None:
        """Write the outcome of ``job``'s attempt; the state its row now has, DEFERRED for a
        plain success left to the batched mark (``batch``), or None if nothing was
        written (the claim was lost, or the worker gave up on an unreachable database).
        A success or a death is counted in the tally (see django_gator.tallies)."""
        if metrics.enabled:
            metrics.job_finished(job, outcome, elapsed_ms)
        state = self._record(job, outcome, elapsed_ms, batch=batch)
        self.tally.add(job.queue, state)
        return state

    def _record(
        self, job: ClaimedJob, outcome: Outcome, elapsed_ms: float, *, batch: bool
    ) -> str | None:
        if isinstance(outcome, Failure):
            return self._failure(job, outcome, elapsed_ms)
        if isinstance(outcome, Snoozed):
            return self._snoozed(job, outcome, elapsed_ms)
        if isinstance(outcome, HandedBack):
            # Counted in handbacks, never charged (see Outcomes.hand_back): the job saved
            # its position and stopped when asked.
            released = self.retrying(
                "hand back a job", functools.partial(self.release, [job], handback=True)
            )
            return JobState.WAITING.value if released else None
        if outcome.written is not None:
            return self._atomic(job, outcome, elapsed_ms)
        if batch:
            return DEFERRED
        return self._success(job, outcome, elapsed_ms)

    def commit(self, job: ClaimedJob, result: str | None) -> bool:
        """An atomic job's success mark (and its chain's next step), written inside the
        transaction that ran handle(); False if the job is no longer ours."""
        return self.engine.with_steps(
            step_ids(job),
            self.follow_ups,
            lambda: self.engine.mark_succeeded_and_insert(
                self.worker_id, Mark.of(job, result), [], self.follow_ups
            ),
        )

    def timeout(self, job: ClaimedJob) -> str | None:
        """Fail a job the watchdog took from its executor."""
        timeout = effective_timeout(get_job_class(job.name)) or 0
        exc = JobTimeout(f"job ran longer than its timeout of {timeout:g} s")
        return self.record(job, failure_for(job, self.worker_id, exc), timeout * 1000, batch=False)

    def stalled(self, job: ClaimedJob, seconds: float) -> str | None:
        """Fail a job the watchdog took from its executor for its ``stall_timeout``."""
        exc = JobStalled(
            f"no progress(), checkpoint() or heartbeat() for {seconds:g} s (its stall_timeout)"
        )
        return self.record(
            job, failure_for(job, self.worker_id, exc, seconds), seconds * 1000, batch=False
        )

    def worker_error(self, job: ClaimedJob, exc: BaseException) -> None:
        """The worker itself failed while finishing ``job`` (writing its outcome, building
        a chain's next step): record that as the attempt's failure, so the job does not
        stay ``running`` under a live worker, where no rescue would ever reach it."""
        try:
            self.record(job, failure_for(job, self.worker_id, exc), 0.0, batch=False)
        except Exception:
            logger.exception("Could not record the failure of job id=%s; it is released", job.id)
            self.retrying("release a job", lambda: self.release([job]))

    # -- batched successes -----------------------------------------------------------------
    @staticmethod
    def marks(batch: Sequence[tuple[ClaimedJob, Success, float]]) -> list[Mark]:
        return [Mark.of(job, success.result) for job, success, _ in batch]

    def write_steps(
        self, batch: Sequence[tuple[ClaimedJob, Success, float]]
    ) -> tuple[list[Mark], list[int]]:
        """Write the batched successes of workflow steps among ``batch`` in one transaction
        that also settles their workflows (releases the steps that waited for them, and a
        batch step whose last member this was). Returns the marks of the other successes,
        still to write, and the ids of the steps written. Raises what the write raised.

        A step's success was once written on its own by its executor: a batch step of
        5,000 members then took 5,000 transactions, one after another on its batch's row
        lock (about 70 members a second on PostgreSQL, a tenth of a Batch's drain)."""
        steps = [item for item in batch if item[0].chain_id is not None]
        if not steps:
            return self.marks(batch), []
        marks = self.marks(steps)
        # The write answers a 1-tuple, never false, so the steps are settled even when the
        # engine cannot tell which marks landed (MariaDB's answer is all or none: a batch
        # holding a mark already written before a lost answer says none). Settling is
        # idempotent: a step already settled, or not final, is left alone.
        [written] = self.engine.with_steps(
            [job.id for job, _, _ in steps],
            self.follow_ups,
            lambda: (self.engine.mark_succeeded(self.worker_id, marks),),
        )
        return self.marks([item for item in batch if item[0].chain_id is None]), written

    def write_steps_alone(
        self, batch: Sequence[tuple[ClaimedJob, Success, float]]
    ) -> list[tuple[ClaimedJob, Success, float]]:
        """After the batched write of ``batch`` failed with an error that trying again
        would meet again (the database refused a statement, or settling a workflow broke):
        write each workflow step's success in a transaction of its own. One bad step then
        neither holds back the others nor stops the fetcher's claims (it would put the
        batch back and fail on it forever). Returns the other successes, still to write;
        raises nothing.

        A step whose own write fails too gets that error as its attempt's failure
        (retried or dead as its class says); if even that cannot be written it is given
        back to ``waiting``; if nothing about its row can be written it stays ``running``
        under this worker, logged, until the worker stops and the rescue takes it back."""
        rest = []
        for item in batch:
            job, success, elapsed_ms = item
            if job.chain_id is None:
                rest.append(item)
                continue
            try:
                self._success(job, success, elapsed_ms)
                continue
            except Exception as exc:
                logger.exception("Could not record the success of step id=%s", job.id)
                error = exc
            try:
                self._failure(job, failure_for(job, self.worker_id, error), elapsed_ms)
                continue
            except Exception:
                logger.exception("Could not record the failure of step id=%s", job.id)
            try:
                self.retrying("release a job", functools.partial(self.release, [job]))
            except Exception:
                logger.exception(
                    "Could not write step id=%s at all: it stays running under this worker "
                    "until the worker stops, when the rescue puts it back",
                    job.id,
                )
        return rest

    def write_batch(self, batch: Sequence[tuple[ClaimedJob, Success, float]]) -> None:
        """Write batched success marks (those the fetcher did not write with a claim): the
        workflow steps' with the settling of their workflows, the others in one
        statement."""
        if not batch:
            return

        def write() -> list[int]:
            plain, written = self.write_steps(batch)
            return written + (self.engine.mark_succeeded(self.worker_id, plain) if plain else [])

        try:
            written = self.retrying(f"record {len(batch)} successes", write)
        except Exception as exc:
            if not has_steps(batch) or not refused(exc):
                raise
            logger.exception("Could not record %s successes together", len(batch))
            batch = self.write_steps_alone(batch)
            marks = self.marks(batch)
            written = (
                self.retrying(
                    f"record {len(batch)} successes",
                    lambda: self.engine.mark_succeeded(self.worker_id, marks),
                )
                if marks
                else []
            )
        if written is not None:
            self.settle_batch(batch, written)

    def settle_batch(
        self, batch: Sequence[tuple[ClaimedJob, Success, float]], written: Sequence[int]
    ) -> None:
        """After a batched mark: log each success, or its loss if its mark missed."""
        written_ids = set(written)
        for job, _success, elapsed_ms in batch:
            if job.id not in written_ids and not self.landed(job, JobState.SUCCEEDED):
                log_lost(job, JobState.SUCCEEDED)
                continue
            if logger.isEnabledFor(logging.INFO):
                log_success(job, elapsed_ms, workflow_part(job))

    # -- giving back -----------------------------------------------------------------------
    def release(self, jobs: Sequence[ClaimedJob], *, handback: bool = False) -> list[int]:
        """Give claims back to ``waiting``, the attempt not charged: jobs that never started
        (claimed while the worker stopped, still pending in its slots, a suspect it could
        not start, a claim whose answer was lost), jobs whose outcome could not be written
        at all, or, with ``handback``, jobs cut off while they ran by a stopping worker
        (see :meth:`hand_back`: only those are counted in the row's ``handbacks``)."""
        claims = [Claim.of(j) for j in jobs]
        released = self.engine.with_steps(
            [id_ for j in jobs for id_ in step_ids(j)],
            self.follow_ups,
            lambda: self.engine.release(self.worker_id, claims, handback=handback),
        )
        logger.info(
            "Released jobs back to waiting worker=%s ids=%s%s",
            self.worker_id,
            ",".join(map(str, released)) or "-",
            " running=yes" if handback else "",
        )
        return released

    def hand_back(
        self, jobs: Sequence[ClaimedJob], ran_ms: Callable[[ClaimedJob], float] | None = None
    ) -> list[int]:
        """A stopping worker gives up jobs that were *running* (the shutdown timeout ran
        out, or a second signal forced the stop): each one's ``handbacks`` goes up by one
        in the write that gives it up. Returns the ids given back to ``waiting``.

        Only these hand-backs count, not those of jobs that never started (see
        :meth:`release`): a job still pending in the slots did nothing and says nothing
        about itself, while a job that was running when the worker stopped may be one
        that never ends. One hand-back is no fault of the job (a deploy came while it
        ran), so its attempt is given back as before. But every ``GATOR_MAX_HANDBACKS``-th
        hand-back of the same job charges the attempt it cut: the attempt fails with
        :class:`~django_gator.exceptions.JobHandedBack` in its error history, and the
        job's retry policy decides (no ``retry``: ``dead``). So a job that blocks forever
        without a ``timeout`` ends after a bounded number of worker stops instead of
        being handed from worker to worker for ever. ``ran_ms(job)``: how long the cut
        attempt ran, for the metrics and job_finished."""
        bound = conf.max_handbacks()
        charged = [j for j in jobs if bound is not None and (j.handbacks + 1) % bound == 0]
        charged_ids = {j.id for j in charged}
        given_back = [j for j in jobs if j.id not in charged_ids]
        released: list[int] = []
        if given_back:
            released = (
                self.retrying(
                    "release interrupted jobs",
                    functools.partial(self.release, given_back, handback=True),
                )
                or []
            )
        for job in charged:
            elapsed_ms = ran_ms(job) if ran_ms is not None else 0.0
            exc = JobHandedBack(
                f"the worker stopped {job.handbacks + 1} times while this job ran "
                f"(GATOR_MAX_HANDBACKS = {bound}); this attempt is charged. A job that "
                "never ends needs a timeout (its class's, or GATOR_DEFAULT_TIMEOUT)"
            )
            failure = failure_for(job, self.worker_id, exc, elapsed_ms / 1000).charging_handback()
            try:
                self.record(job, failure, elapsed_ms, batch=False)
            except Exception:
                logger.exception(
                    "Could not charge the hand-back of job id=%s; it is released", job.id
                )
                self.retrying(
                    "release a job", functools.partial(self.release, [job], handback=True)
                )
        return released
