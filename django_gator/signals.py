"""Signals sent around a job's life. Receivers that raise are logged (by Django, on the
``django.dispatch`` logger) and never stop a dispatch or a worker.

``job_dispatched(sender=JobClass, jobs=[Job, ...])``
    After the INSERT of a dispatch or dispatch_many (so on commit when the insert was
    deferred with ``on_commit``). ``jobs`` holds only the rows that were created: a unique
    job that was already waiting is not in it.
``job_started(sender=JobClass, job=instance)``
    In the worker thread, just before the middleware and ``handle()`` run. ``job`` is the
    Queueable instance (``job.job_id``, ``job.attempt``, ``job.queue``, ``job.args``,
    ``job.kwargs``).
``job_finished(sender=JobClass, job=instance, state=..., exception=..., duration=...)``
    When the attempt is over: ``state`` is what the row becomes (``"succeeded"``,
    ``"failed"`` (will retry), ``"dead"`` or ``"cancelled"``), ``exception`` is what
    ``handle()`` raised (None on success), ``duration`` the seconds the attempt took. A
    success is sent before its row is written (workers write successes in batches).
"""

from __future__ import annotations

from typing import Any

from django.dispatch import Signal

job_dispatched = Signal()
job_started = Signal()
job_finished = Signal()


def send(signal: Signal, sender: type, **kwargs: Any) -> None:
    """Send ``signal`` if anything listens. A receiver's exception is not raised: Django's
    ``send_robust`` logs it, with its traceback, on the ``django.dispatch`` logger."""
    if signal.has_listeners(sender):
        signal.send_robust(sender, **kwargs)
