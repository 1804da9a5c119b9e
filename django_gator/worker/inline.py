"""Running chosen jobs in the calling thread, with the worker's claim, outcome writes,
retries, chains and atomic transactions: what ``GATOR_IMMEDIATE`` and
:func:`django_gator.testing.run_jobs` use. No threads, no heartbeat, no timeouts."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from secrets import token_hex

from django_gator.chain import error_handler, next_step
from django_gator.engines import ClaimedJob, get_engine
from django_gator.engines.base import Failure
from django_gator.logutil import safe
from django_gator.worker.execution import outcome_state, run_claimed

logger = logging.getLogger("django_gator.worker")


@dataclass(slots=True)
class InlineRun:
    """One job run in the calling thread."""

    job: ClaimedJob
    state: str  # what the row became: succeeded, failed, dead or cancelled
    exception: BaseException | None = None
    #: Jobs the outcome created (a chain's next step or its error handler).
    follow_ups: list[int] = field(default_factory=list)


def inline_worker_id() -> str:
    return f"inline:{os.getpid()}:{token_hex(4)}"


def run_inline(alias: str, job_id: int, worker_id: str) -> InlineRun | None:
    """Claim job ``job_id`` and run it here; None if it was not waiting or failed."""
    engine = get_engine(alias)
    job = engine.claim_by_id(worker_id, job_id)
    if job is None:
        return None
    follow_ups: list[int] = []

    def commit(result: str | None) -> bool:
        following = next_step(job) if job.chain_id is not None else None
        return engine.mark_succeeded_and_insert(
            worker_id,
            (job.id, job.attempts, result),
            [following] if following is not None else [],
            follow_ups,
        )

    outcome = run_claimed(job, worker_id, commit)
    if isinstance(outcome, Failure):
        handler = error_handler(job) if outcome.dead and job.chain_id is not None else None
        written = engine.mark_failed_and_insert(
            worker_id, job.id, job.attempts, outcome, [handler] if handler else [], follow_ups
        )
        state = outcome_state(outcome, None)
        exception = outcome.exception
    else:
        written = outcome.written if outcome.written is not None else commit(outcome.result)
        state, exception = "succeeded", None
    if not written:
        current = engine.claim_state(job.id)
        logger.warning(
            "Lost job id=%s name=%s: its row changed while it ran (now %s)",
            job.id,
            safe(job.name),
            current[0] if current else "deleted",
        )
        state = current[0] if current else "deleted"
    logger.debug("Ran job inline id=%s name=%s state=%s", job.id, safe(job.name), state)
    return InlineRun(job=job, state=state, exception=exception, follow_ups=follow_ups)
