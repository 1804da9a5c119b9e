"""The indexes the claim and the rescue depend on: what they are.

PostgreSQL and SQLite get partial indexes that hold only the rows they serve, so finished
jobs piling up never slow a claim. MySQL and MariaDB have no partial indexes: there a virtual
column ``ready_rank`` (``-priority`` while the job is waiting or failed, NULL otherwise)
leads an index that the claim walks in order, stopping after the rows it takes; without it
InnoDB would lock every row it scanned and SKIP LOCKED would starve the other workers.

These live in migrations rather than in ``Job.Meta.indexes`` so that no database is asked
for an index it cannot build (Django warns with models.W037 on MariaDB otherwise). This
module declares them; how each database builds them (the migrations' steps, MySQL's
statements) is the engines' part: ``django_gator.engines.schema``.
"""

from __future__ import annotations

from django.db import models

from django_gator import states
from django_gator.states import READY_STATES, SLEEP_JOB, WAIT_JOB, JobState, sql_list

READY_STATES_SQL = sql_list(READY_STATES)
#: States in which a unique job blocks a second dispatch with the same key.
ACTIVE_STATES = [state.value for state in states.ACTIVE_STATES]
#: The job names of workflow steps that stay open for a while (a sleep, a wait for a signal).
OPEN_STEP_JOBS = (SLEEP_JOB, WAIT_JOB)


def partial_indexes(*, flow: bool = False) -> list[models.Index]:
    """The claim's and the rescue's indexes. ``flow``: as migration 0009 left them, where
    the ready index holds only the jobs without a concurrency key (the others are in
    flow_indexes())."""
    ready = models.Q(state__in=[state.value for state in READY_STATES])
    return [
        # WHERE state IN ready AND queue = %s AND next_execution_at <= now
        # ORDER BY priority DESC, next_execution_at, id
        models.Index(
            fields=["queue", "-priority", "next_execution_at", "id"],
            name="gator_job_ready",
            condition=ready & models.Q(concurrency_key__isnull=True) if flow else ready,
        ),
        # Rescue and shutdown: the running jobs, by worker.
        models.Index(
            fields=["reserved_by"],
            name="gator_job_running",
            condition=models.Q(state=JobState.RUNNING.value),
        ),
    ]


# -- flow control (migration 0009) ---------------------------------------------------------


def flow_indexes() -> list[models.Index]:
    """The indexes of the limited claim: the ready jobs of limited classes (kept out of
    ``gator_job_ready``, so the ordinary claim never steps over them), and the running jobs
    it counts, per key and per queue."""
    ready = models.Q(state__in=[state.value for state in READY_STATES])
    running = models.Q(state=JobState.RUNNING.value)
    return [
        models.Index(
            fields=["queue", "-priority", "next_execution_at", "id"],
            name="gator_job_ready_keyed",
            condition=ready & models.Q(concurrency_key__isnull=False),
        ),
        models.Index(
            fields=["name", "concurrency_key"],
            name="gator_job_running_keyed",
            condition=running & models.Q(concurrency_key__isnull=False),
        ),
        models.Index(fields=["queue"], name="gator_job_running_queue", condition=running),
    ]


def has_flow(job: type[models.Model]) -> bool:
    """Whether the (historical) Job model has migration 0009's concurrency_key."""
    return any(field.name == "concurrency_key" for field in job._meta.fields)


# -- unique jobs (migration 0003) ---------------------------------------------------------


def unique_constraint() -> models.UniqueConstraint:
    # At most one active row per (job name, unique key); finished rows never collide.
    return models.UniqueConstraint(
        fields=["name", "unique_key"],
        condition=models.Q(unique_key__isnull=False, state__in=ACTIVE_STATES),
        name="gator_job_unique",
    )


# -- the dead-job screen (migration 0005) --------------------------------------------------


def groups_index() -> models.Index:
    # Dead and failed jobs by name and error class. Partial, so that the claims and success
    # marks of a busy queue (which change `state` on every row) never touch it. MySQL and
    # MariaDB get none: their dead-job screen reads the dead rows through the
    # (state, finished_at) index instead.
    return models.Index(
        fields=["state", "name", "error_class"],
        name="gator_job_groups",
        condition=models.Q(state__in=[JobState.DEAD.value, JobState.FAILED.value]),
    )


# -- the queue figures' dead counts (migration 0018) ------------------------------------------


def dead_queue_index() -> models.Index:
    # The dead jobs by queue: the Prometheus view counts them per queue from this index
    # alone (PostgreSQL: an index-only scan), instead of visiting every dead row, which stay
    # until an operator prunes them. MySQL and MariaDB count them from 0013's (state, queue).
    return models.Index(
        fields=["queue"],
        name="gator_job_dead_queue",
        condition=models.Q(state=JobState.DEAD.value),
    )


# -- batch members (migration 0017) -----------------------------------------------------------

#: Migration 0012's index of every job row by (batch_id, state); MySQL and MariaDB keep it
#: (their engine names it in FORCE INDEX).
FULL_BATCH_INDEX = "gator_job_batch"


def full_batch_index() -> models.Index:
    return models.Index(fields=["batch_id", "state"], name=FULL_BATCH_INDEX)


def batch_index() -> models.Index:
    # A batch's members by state: its completion check, its workflow step's settling, its
    # admin page, the pruning of finished batches. Partial, so that the jobs outside any
    # batch (most of them) have no entry: their claims and outcome marks never write it.
    return models.Index(
        fields=["batch_id", "state"],
        name="gator_job_batch_member",
        condition=models.Q(batch_id__isnull=False),
    )


# -- windows and expiry (migration 0023) ------------------------------------------------------


def dedupe_waiting_constraint() -> models.UniqueConstraint:
    # At most one waiting job per (job name, dedupe key): what a debounced or throttled
    # dispatch replaces or joins. A running one does not count (the next may wait beside it).
    return models.UniqueConstraint(
        fields=["name", "dedupe_key"],
        condition=models.Q(dedupe_key__isnull=False, state=JobState.WAITING.value),
        name="gator_job_dedupe_waiting",
    )


def dedupe_indexes() -> list[models.Index]:
    ready = models.Q(state__in=[state.value for state in READY_STATES])
    return [
        # A key's jobs, newest start last: a throttle's last start, a unique_for window's
        # finished job. Partial: jobs of other classes have no entry.
        models.Index(
            fields=["name", "dedupe_key", "started_at"],
            name="gator_job_dedupe",
            condition=models.Q(dedupe_key__isnull=False),
        ),
        # The ready jobs that expire, soonest first: what the expiry sweep settles.
        models.Index(
            fields=["expires_at"],
            name="gator_job_expiring",
            condition=ready & models.Q(expires_at__isnull=False),
        ),
    ]


# -- weighted fair share (migration 0027) -----------------------------------------------------


def fair_index() -> models.Index:
    # The claim of a fair queue: WHERE state IN ready AND queue = %s AND fair_order IS NOT
    # NULL ORDER BY priority DESC, fair_order, id. Only the jobs of fair queues have an
    # entry: jobs of other queues never write it.
    ready = models.Q(state__in=[state.value for state in READY_STATES])
    return models.Index(
        fields=["queue", "-priority", "fair_order", "id"],
        name="gator_job_ready_fair",
        condition=ready
        & models.Q(concurrency_key__isnull=True)
        & models.Q(fair_order__isnull=False),
    )


# -- the workflow gauges (migration 0029) -----------------------------------------------------


def open_steps_index() -> models.Index:
    # The sleep and wait steps not ended, by name and queue, oldest first: the Prometheus
    # view's workflow gauges read these entries alone instead of every unfinished job.
    # Partial: no other job has an entry, so their dispatches, claims and marks never write
    # it. MySQL and MariaDB get none (their gauges read the unfinished jobs by state).
    return models.Index(
        fields=["name", "queue", "created_at"],
        name="gator_job_open_steps",
        condition=models.Q(name__in=OPEN_STEP_JOBS) & models.Q(state__in=ACTIVE_STATES),
    )
