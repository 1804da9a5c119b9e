"""The one place where the package's layers are wired upward.

Lower layers call code that sits above them, without importing it (the layers of
``.importlinter`` forbid that): GATOR_IMMEDIATE runs jobs with the worker's inline runner;
the engines bound the LISTEN connection they open themselves with the worker's network
bounds, and wake the idle workers of the queues they give jobs with wakeup datagrams
where there is no LISTEN; the job verbs of ``models/`` settle, re-open and probe batches
with the engines' statements; an operator's cancel or discard settles the workflow steps
it ended; a signal that makes a wait step's job due wakes the idle workers; the metrics
count the signals sent; and ``wait_result()`` listens for the ends it waits for
(endwatch).
:func:`install` puts each in place; the app's ``ready()`` calls it, and :func:`installed`
says which are (a test holds every one to it).
"""

from __future__ import annotations

from collections.abc import Collection

from django_gator import conf, endwatch, immediate, wakeup
from django_gator.engines import core as engines
from django_gator.engines import get_engine
from django_gator.metrics import workflows as workflow_metrics
from django_gator.models import awaiting, job_queries, membership, settling, workflows
from django_gator.worker import connections, inline


def install() -> None:
    """Install every upward call (idempotent)."""
    immediate.set_inline_runner(inline.run_inline, inline.inline_worker_id)
    awaiting.set_watcher(endwatch.watch)
    engines.set_connection_hook(connections.bound_connection)
    engines.set_wakeup_hook(wakeup.after_commit)
    membership.install(
        settle=_settle_batches,
        reopen=lambda alias, ids: get_engine(alias).reopen_batches(ids),
        probe=lambda alias, batch_id: get_engine(alias).probe_batch(batch_id),
    )
    if settling.settle_cancelled not in job_queries.cancel_hooks:
        job_queries.cancel_hooks.append(settling.settle_cancelled)
    if _wake not in workflows.wake_hooks:
        workflows.wake_hooks.append(_wake)
    if workflow_metrics.count_signal not in workflows.signal_hooks:
        workflows.signal_hooks.append(workflow_metrics.count_signal)


def installed() -> dict[str, bool]:
    """Each upward call, and whether it is in place."""
    return {
        "immediate.inline_runner": immediate.inline_runner_installed(),
        "models.awaiting.watcher": awaiting.watcher_installed(),
        "engines.connection_hook": engines.connection_hook_installed(),
        "engines.wakeup_hook": engines.wakeup_hook_installed(),
        "models.membership": membership.installed(),
        "models.job_queries.cancel_hooks": settling.settle_cancelled in job_queries.cancel_hooks,
        "models.workflows.wake_hooks": _wake in workflows.wake_hooks,
        "models.workflows.signal_hooks": workflow_metrics.count_signal in workflows.signal_hooks,
    }


def _wake(alias: str, queues: Collection[str]) -> None:
    """A signal made a wait's job due: NOTIFY (PostgreSQL, at commit) or wakeup datagrams."""
    get_engine(alias).wake(queues)


def _settle_batches(alias: str, ids: Collection[int]) -> None:
    """The job verbs' batch settling: dispatch the callbacks now due, and under
    GATOR_IMMEDIATE run them as a dispatch would."""
    callbacks = get_engine(alias).settle_now(ids)
    if callbacks and conf.immediate():
        immediate.after_commit(alias, lambda: immediate.run_immediately(alias, callbacks))
