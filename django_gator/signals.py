"""Signals sent around a job's life. Receivers that raise are logged (by Django, on the
``django.dispatch`` logger) and never stop a dispatch or a worker.

``job_dispatched(sender=JobClass, jobs=[Job, ...])``
    After the INSERT of a dispatch or dispatch_many (so on commit when the insert was
    deferred with ``on_commit``). ``jobs`` holds only the rows that were created: a unique
    job that was already waiting is not in it.
``dispatch_failed(sender=JobClass, jobs=[Job, ...], exception=exc)``
    When the INSERT deferred by ``dispatch(..., on_commit=True)`` still failed after its
    retries (``GATOR_DISPATCH_ON_COMMIT_RETRY_DELAYS``): the caller's transaction has
    committed and these jobs do not exist. ``jobs`` are the unsaved rows (``pk`` is None;
    name, args, kwargs, queue, priority and ``next_execution_at`` as dispatched), enough to
    store them elsewhere or alert; ``exception`` is the last error. Each job is also logged
    at ERROR on the ``django_gator.dispatch`` logger.
``job_started(sender=JobClass, job=instance)``
    In the worker thread, just before the middleware and ``handle()`` run. ``job`` is the
    Queueable instance (``job.job_id``, ``job.attempt``, ``job.queue``, ``job.args``,
    ``job.kwargs``).
``job_finished(sender=JobClass, job=instance, state=..., exception=..., duration=...)``
    When the attempt is over: ``state`` is what the row becomes (``"succeeded"``,
    ``"failed"`` (will retry), ``"dead"``, ``"cancelled"``, or ``"waiting"`` when it
    raised :class:`~django_gator.Snooze`), ``exception`` is what ``handle()`` raised (None
    on success; the Snooze for a snooze), ``duration`` the seconds the attempt took. A
    success is sent before its row is written (workers write successes in batches).
"""

from __future__ import annotations

from typing import Any

from django.dispatch import Signal

# use_caching: each sender's receivers are looked up once (the cache is cleared on every
# connect and disconnect), not under the signal's lock twice per job in every executor.
job_dispatched = Signal(use_caching=True)
dispatch_failed = Signal(use_caching=True)
job_started = Signal(use_caching=True)
job_finished = Signal(use_caching=True)


def send(signal: Signal, sender: type, **kwargs: Any) -> None:
    """Send ``signal`` if anything listens. A receiver's exception is not raised: Django's
    ``send_robust`` logs it, with its traceback, on the ``django.dispatch`` logger."""
    if signal.has_listeners(sender):
        signal.send_robust(sender, **kwargs)
