"""GATOR_IMMEDIATE: dispatched jobs run in the dispatching thread once their rows are
committed, through the same claim and outcome writes as a worker (a test setting).

Running a job is the worker's code, which sits above dispatch in the package's layers:
the app's ``ready()`` installs it here (:func:`set_inline_runner`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction

from django_gator.models import JobState


def after_commit(alias: str, callback: Callable[[], None]) -> None:
    """Run ``callback`` once the jobs' rows are committed: now in autocommit, or inside
    nothing but a TestCase's transaction (which never commits); otherwise on commit."""
    connection = connections[alias]
    if all(getattr(block, "_from_testcase", False) for block in connection.atomic_blocks):
        callback()
    else:
        transaction.on_commit(callback, using=alias)


class InlineRun(Protocol):
    """What running one job in this thread reports (worker.inline.InlineRun)."""

    @property
    def state(self) -> str: ...  # what the row became

    @property
    def exception(self) -> BaseException | None: ...

    @property
    def follow_ups(self) -> list[int]: ...  # jobs the outcome created (chain steps)


class InlineRunner(Protocol):
    def __call__(self, alias: str, job_id: int, worker_id: str) -> InlineRun | None:
        """Claim job ``job_id`` as ``worker_id`` and run it in this thread, writing its
        outcome as a worker does; None if it was not there to claim."""


_inline_runner: InlineRunner | None = None
_inline_worker_id: Callable[[], str] | None = None


def set_inline_runner(runner: InlineRunner, worker_id: Callable[[], str]) -> None:
    """Install what GATOR_IMMEDIATE runs a job with, and the worker ids it claims under.

    Running a job is the worker's code, which sits above dispatch: dispatch does not import
    it. The app's ready() installs worker.inline's run_inline and inline_worker_id."""
    global _inline_runner, _inline_worker_id
    _inline_runner, _inline_worker_id = runner, worker_id


def inline_runner_installed() -> bool:
    return _inline_runner is not None and _inline_worker_id is not None


def run_immediately(alias: str, job_ids: list[int]) -> None:
    """GATOR_IMMEDIATE: run these jobs, and the chain steps they lead to, in this thread.

    A job that ends ``dead`` has its exception raised here (after its row was written),
    so a test sees it; one that will be retried stays ``failed`` for run_jobs()."""
    run_inline, inline_worker_id = _inline_runner, _inline_worker_id
    if run_inline is None or inline_worker_id is None:
        raise ImproperlyConfigured(
            "GATOR_IMMEDIATE is on but nothing can run jobs in this process yet: the "
            "django_gator app installs its runner when Django's apps are ready (is "
            "'django_gator' in INSTALLED_APPS, and was django.setup() called?)"
        )
    worker_id = inline_worker_id()
    todo = list(job_ids)
    while todo:
        outcome = run_inline(alias, todo.pop(0), worker_id)
        if outcome is None:
            continue
        todo += outcome.follow_ups
        if outcome.state == JobState.DEAD and outcome.exception is not None:
            raise outcome.exception
