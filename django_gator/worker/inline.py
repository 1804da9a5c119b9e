"""Running chosen jobs in the calling thread, with the worker's claim, outcome writes,
retries, chains and atomic transactions: what ``GATOR_IMMEDIATE`` and
:func:`django_gator.testing.run_jobs` use. No threads, no heartbeat, no timeouts."""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass, field
from secrets import token_hex

from django_gator.attempts import Failure
from django_gator.engines import ClaimedJob, get_engine
from django_gator.logutil import safe
from django_gator.worker.execution import run_claimed
from django_gator.worker.outcomes import Outcomes
from django_gator.worker.progress import journal_for

logger = logging.getLogger("django_gator.worker")


@dataclass(slots=True)
class InlineRun:
    """One job run in the calling thread."""

    job: ClaimedJob
    state: str  # what the row became: succeeded, failed, dead, cancelled or waiting (snoozed)
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
    outcomes = Outcomes(engine, worker_id, follow_ups=follow_ups)
    started = time.perf_counter()
    journal = journal_for(job, engine, worker_id)
    outcome = run_claimed(job, worker_id, functools.partial(outcomes.commit, job), journal=journal)
    elapsed_ms = (time.perf_counter() - started) * 1000
    state = outcomes.record(job, outcome, elapsed_ms, batch=False)
    outcomes.tally.flush(alias)  # no heartbeat here: counted for the dashboard at once
    if state is None:  # the row changed while the job ran (the outcome says how)
        current = engine.claim_state(job.id)
        state = current[0] if current else "deleted"
    exception = outcome.exception if isinstance(outcome, Failure) else None
    logger.debug("Ran job inline id=%s name=%s state=%s", job.id, safe(job.name), state)
    return InlineRun(job=job, state=state, exception=exception, follow_ups=follow_ups)
