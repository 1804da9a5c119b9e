"""The states of a job, and everything derived from them: the groups other code asks
about (ready, active, final) and the SQL fragments the engines and indexes use. No other
module spells a state."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import models


class JobState(models.TextChoices):
    """Where a job is in its life.

    ``waiting``: ready now, or scheduled for ``next_execution_at``.
    ``running``: claimed by the worker named in ``reserved_by``.
    ``succeeded``: ``handle()`` returned.
    ``failed``: ``handle()`` raised and the retry policy will run it again at
    ``next_execution_at``.
    ``dead``: no more attempts (retries exhausted, no retry policy, an unknown job name,
    or the job kept killing its worker). Only an operator brings it back.
    ``cancelled``: an operator or the code cancelled it before it ran.
    """

    WAITING = "waiting", "Waiting"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed (will retry)"
    DEAD = "dead", "Dead"
    CANCELLED = "cancelled", "Cancelled"


#: States a worker may claim from once ``next_execution_at`` has passed.
READY_STATES = (JobState.WAITING, JobState.FAILED)
#: States of a job that has not ended: it may still run (unique keys are held by these).
ACTIVE_STATES = (JobState.WAITING, JobState.FAILED, JobState.RUNNING)
#: States no worker ever leaves on its own.
FINAL_STATES = (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED)

#: The internal job names of workflow sleep and wait steps (django_gator.workflow_waits).
SLEEP_JOB, WAIT_JOB = "gator.sleep", "gator.wait"


def sql_list(states: Iterable[str]) -> str:
    """``('waiting', 'failed')``: states as an SQL list (they are fixed identifiers, so
    inlining them is safe and lets partial indexes match)."""
    return "(" + ", ".join(f"'{JobState(state).value}'" for state in states) + ")"


def sql_literal(state: str) -> str:
    """``'running'``: one state as an SQL literal."""
    return f"'{JobState(state).value}'"


#: The condition of a job a worker may claim (with a due ``next_execution_at``).
READY_SQL = f"state IN {sql_list(READY_STATES)}"
#: The condition of a job that has not ended.
ACTIVE_SQL = f"state IN {sql_list(ACTIVE_STATES)}"
#: The condition of a claimed job.
RUNNING_SQL = f"state = {sql_literal(JobState.RUNNING)}"


def live_sql(now_sql: str, table: str = "") -> str:
    """The condition of a job that has not expired at ``now_sql``: every claim statement
    has it, so a job past its ``expires_at`` is never started, however late a worker
    comes. Jobs without an expiry pass on the first test (their column is NULL)."""
    return f"({table}expires_at IS NULL OR {table}expires_at > {now_sql})"


#: Each state as an SQL literal, for the engines' statements.
SQL_WAITING = sql_literal(JobState.WAITING)
SQL_RUNNING = sql_literal(JobState.RUNNING)
SQL_SUCCEEDED = sql_literal(JobState.SUCCEEDED)
SQL_FAILED = sql_literal(JobState.FAILED)
SQL_DEAD = sql_literal(JobState.DEAD)
SQL_CANCELLED = sql_literal(JobState.CANCELLED)


def claim_set_sql(now_sql: str, table: str = "") -> str:
    """The SET clause of every claim: the row becomes ``running``, charged one attempt,
    under the worker given as the statement's first parameter. ``table``: a qualifier for
    the columns read (``j.`` where the statement names the table ``j``)."""
    return (
        f"state = {SQL_RUNNING}, attempts = {table}attempts + 1, reserved_by = %s, "
        f"locked_at = {now_sql}, isolated = FALSE, "
        f"started_at = COALESCE({table}started_at, {now_sql})"
    )


class StepState(models.TextChoices):
    """Where a workflow step is (``django_gator_workflow_step.state``).

    ``blocked``: some step it comes after has not succeeded yet; it has no job row, so
    no claim ever reads it. ``released``: all its dependencies are satisfied and its job
    row exists (the job's own state says the rest). ``succeeded``, ``dead``,
    ``cancelled``: the final state of its job, written in the transaction that wrote the
    job's. A blocked step whose ancestor died (or was cancelled) becomes ``cancelled``
    itself, with the reason, and never gets a job row.
    """

    BLOCKED = "blocked", "Blocked (waiting on dependencies)"
    RELEASED = "released", "Released (its job is queued or running)"
    SUCCEEDED = "succeeded", "Succeeded"
    DEAD = "dead", "Dead"
    CANCELLED = "cancelled", "Cancelled"
