"""Helpers for the tests of a project that dispatches jobs.

``run_jobs()`` runs what is due in the test's own thread and database connection (so it
works inside ``TestCase``'s transaction), with a clock you can move forward to reach
scheduled jobs and retries. ``assert_dispatched()`` and ``assert_not_dispatched()`` check
what a piece of code enqueued. See also the ``GATOR_IMMEDIATE`` setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from django_gator import wording
from django_gator.databases import job_databases
from django_gator.dbtime import DbNow
from django_gator.jobfunction import JobFunction, resolve_job_class
from django_gator.queueable import Queueable
from django_gator.states import JobState
from django_gator.validation import short_repr

__all__ = ["assert_dispatched", "assert_not_dispatched", "run_jobs"]


class TooManyJobs(AssertionError):
    """run_jobs() hit its ``max_jobs`` limit: probably a job that keeps dispatching itself."""


def run_jobs(
    *,
    now: datetime | None = None,
    advance: timedelta | float | None = None,
    queue: str | Sequence[str] | None = None,
    max_jobs: int = 1000,
    raise_errors: bool = True,
) -> list[Any]:
    """Run every job due by ``now`` until none is left; returns the rows run, in order.

    ``now`` (an aware datetime) or ``advance`` (a timedelta or seconds from the current
    time) sets the clock that decides what is due, so scheduled jobs and retries can be
    reached without waiting; by default it is the current time. A job past its
    ``expires_at`` by that clock is left alone, as a worker leaves an expired job. Jobs that the run
    dispatches, retries that fall due and next chain steps run too, each in this thread,
    through the same claim, retry, chain and atomic-transaction code as the worker. Jobs of
    paused queues are left waiting, as a worker leaves them. With several job databases
    (GATOR_QUEUE_DATABASES) the jobs of each run, one database's due jobs after another's.

    With ``raise_errors`` (the default) the first job that ends ``dead`` has its exception
    raised here, after its row was written; a job that will be retried is not an error.
    ``max_jobs`` stops a job that keeps dispatching itself: :class:`TooManyJobs`.
    """
    # Here, not at the top: a project's test modules may import this module before Django's
    # apps are ready, and the models and the worker need them. Not an import cycle.
    from django_gator.models import Job
    from django_gator.worker.inline import inline_worker_id, run_inline

    advance = _advance(now, advance)
    queues = [queue] if isinstance(queue, str) else list(queue or [])
    worker_id = inline_worker_id()
    ran: list[tuple[str, int]] = []
    while True:
        clock = now or timezone.now() + advance
        found = _next_anywhere(clock, queues)
        if found is None:
            break
        alias, job_id = found
        if len(ran) >= max_jobs:
            raise TooManyJobs(
                f"run_jobs() ran {wording.count(max_jobs, 'job')} and more are due; "
                "raise max_jobs= if that is expected, or look for a job that dispatches itself"
            )
        outcome = run_inline(alias, job_id, worker_id)
        if outcome is None:
            continue  # taken by someone else meanwhile
        ran.append(found)
        if raise_errors and outcome.state == JobState.DEAD and outcome.exception is not None:
            raise outcome.exception
    rows = {
        (alias, pk): row
        for alias in {alias for alias, _ in ran}
        for pk, row in Job.objects.using(alias).in_bulk([p for a, p in ran if a == alias]).items()
    }
    return [rows[key] for key in ran if key in rows]


def _next_anywhere(clock: datetime, queues: list[str]) -> tuple[str, int] | None:
    """(alias, id) of the job a worker would claim next, looking at each job database in
    turn (GATOR_DATABASE alone unless GATOR_QUEUE_DATABASES); None when none is due."""
    for alias in job_databases():
        job_id = _next_due(alias, clock, queues)
        if job_id is not None:
            return alias, job_id
    return None


def _advance(now: datetime | None, advance: timedelta | float | None) -> timedelta:
    """run_jobs()'s ``advance`` as a timedelta (zero without one); ValueError for both
    ``now`` and ``advance``, or a naive ``now``."""
    if now is not None and advance is not None:
        raise ValueError("pass either now= or advance=, not both")
    if now is not None and timezone.is_naive(now):
        raise ValueError(f"now= must be timezone-aware, got {now.isoformat()}")
    if isinstance(advance, int | float):
        return timedelta(seconds=advance)
    return advance or timedelta()


def _next_due(alias: str, clock: datetime, queues: list[str]) -> int | None:
    """The id of the job a worker would claim next at ``clock`` (of ``queues``, if any);
    None when none is due."""
    from django_gator.models import READY_STATES, Job, Queue  # not at the top: see run_jobs()

    due = (
        Job.objects.using(alias)
        .filter(state__in=READY_STATES, next_execution_at__lte=clock)
        .exclude(queue__in=Queue.objects.using(alias).paused_names())
        # Past its expires_at by the clock, or by the database's (no claim would take it).
        .exclude(expires_at__lte=clock)
        .exclude(expires_at__lte=DbNow())
    )
    if queues:
        due = due.filter(queue__in=queues)
    order = due.order_by("-priority", "next_execution_at", "id")
    return order.values_list("pk", flat=True).first()


def _call(job_class: type[Queueable], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """The arguments as handle() sees them, so f(5) and f(user_id=5) compare equal."""
    try:
        bound = job_class.traits.signature.bind(*args, **kwargs)
    except TypeError:
        return (list(args), dict(kwargs))
    bound.apply_defaults()
    return dict(bound.arguments)


def _matching(
    job: type[Queueable] | JobFunction,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    queue: str | None,
    with_arguments: bool,
) -> tuple[list[Any], list[Any]]:
    from django_gator.models import Job  # not at the top: see run_jobs()

    job_class = resolve_job_class(job)
    rows = [
        row
        for alias in job_databases()
        for row in Job.objects.using(alias).filter(name=job_class.name).order_by("id")
    ]
    candidates = rows if queue is None else [row for row in rows if row.queue == queue]
    if not with_arguments:
        return candidates, rows
    wanted = _call(job_class, args, kwargs)
    return [row for row in candidates if _call(job_class, row.args, row.kwargs) == wanted], rows


def _describe(rows: list[Any]) -> str:
    if not rows:
        return "none were dispatched"
    shown = [
        f"  #{row.pk} queue={row.queue} state={row.state} args={short_repr(row.args, 120)} "
        f"kwargs={short_repr(row.kwargs, 120)}"
        for row in rows[:10]
    ]
    more = f"\n  ... and {len(rows) - 10} more" if len(rows) > 10 else ""
    were = "was" if len(rows) == 1 else "were"
    return f"{len(rows)} {were} dispatched:\n" + "\n".join(shown) + more


def assert_dispatched(
    job: type[Queueable] | JobFunction,
    *args: Any,
    count: int | None = None,
    queue: str | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Assert that jobs of ``job`` exist (in any state), optionally with these arguments
    (compared as ``handle()`` would receive them), on ``queue``, exactly ``count`` times.
    Returns the matching rows."""
    matches, rows = _matching(job, args, kwargs, queue, bool(args or kwargs))
    name = resolve_job_class(job).name
    what = _what(name, args, kwargs, queue)
    if count is None and not matches:
        raise AssertionError(f"expected {what} to be dispatched; {_describe(rows)}")
    if count is not None and len(matches) != count:
        raise AssertionError(
            f"expected {what} to be dispatched {wording.count(count, 'time')}, "
            f"found {len(matches)}; "
            f"{_describe(rows)}"
        )
    return matches


def assert_not_dispatched(
    job: type[Queueable] | JobFunction, *args: Any, queue: str | None = None, **kwargs: Any
) -> None:
    """Assert that no job of ``job`` (with these arguments, on ``queue``, if given) exists."""
    matches, _ = _matching(job, args, kwargs, queue, bool(args or kwargs))
    if matches:
        what = _what(resolve_job_class(job).name, args, kwargs, queue)
        raise AssertionError(f"expected no {what}; {_describe(matches)}")


def _what(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], queue: str | None) -> str:
    parts = [short_repr(a) for a in args] + [f"{k}={short_repr(v)}" for k, v in kwargs.items()]
    text = f"{name}({', '.join(parts)})" if parts else name
    return f"{text} on queue {queue!r}" if queue is not None else text
