"""Pausing and resuming queues: ``pause_queue("emails")`` / ``resume_queue("emails")``.

A paused queue keeps its jobs, and new ones keep arriving, but no worker claims any of them
until it is resumed; jobs already running finish. The state is the queue's row in
``django_gator_queue`` (:class:`~django_gator.models.Queue`), which every claim statement
reads, so a pause reaches every worker on every machine at its next claim. A resume also
wakes the listening workers at once on PostgreSQL (a NOTIFY, as dispatch sends); elsewhere
the workers find the jobs at their next poll (``GATOR_POLL_INTERVAL``).

Pausing a paused queue, or resuming one that is not paused, changes nothing: the first
pause's who and when stay recorded.
"""

from __future__ import annotations

from django.db import transaction

from django_gator.databases import for_queue
from django_gator.engines import get_engine
from django_gator.models import Queue


def pause_queue(name: str, *, by: str | None = None) -> bool:
    """Stop every worker claiming jobs of the queue ``name``. ``by``: who asked, as the
    queue's row records it. True if the queue was not paused before.

    ValueError, naming it, if ``name`` is not a valid queue name."""
    return Queue.objects.using(for_queue(name)).pause(name, by=by or "")


def resume_queue(name: str, *, by: str | None = None) -> bool:
    """Let the workers claim the jobs of the queue ``name`` again. True if it was paused.

    ValueError, naming it, if ``name`` is not a valid queue name."""
    alias = for_queue(name)
    with transaction.atomic(using=alias):
        resumed = Queue.objects.using(alias).resume(name, by=by or "")
        if resumed:
            get_engine(alias).wake([name])  # sent on commit
    return resumed
