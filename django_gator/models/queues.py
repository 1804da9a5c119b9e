"""The queue table: one row per queue that an operator has acted on (paused, resumed).

A queue exists as soon as a job names it; it has a row here only once someone paused it
(or, later, gave it settings of its own). The claim statement of every engine reads the row
of the queue it claims from (a primary-key probe), so a pause committed here stops every
worker on every machine at its next claim, with no cache to expire.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from django_gator.logutil import safe
from django_gator.validation import QUEUE_MAX_LENGTH, validate_queue

logger = logging.getLogger("django_gator.audit")

#: Longest "who" recorded (``paused_by``, ``updated_by``); longer values are cut.
BY_MAX_LENGTH = 150


class QueueQuerySet(models.QuerySet["Queue"]):
    def paused_names(self) -> models.QuerySet[Queue, dict[str, Any]]:
        """The names of the paused queues, as a subquery for ``queue__in``."""
        return self.filter(paused=True).values("name")

    def pause(self, name: str, *, by: str = "") -> bool:
        """Pause the queue ``name``: no worker claims its jobs until it is resumed.

        True if this call paused it; False if it was paused already, in which case the
        row is left as it is (who paused it first, and when, stay recorded).
        ValueError if ``name`` is not a valid queue name."""
        validate_queue(name)
        by = str(by)[:BY_MAX_LENGTH]
        now = timezone.now()
        fields = {"paused_at": now, "paused_by": by, "updated_at": now, "updated_by": by}
        with transaction.atomic(using=self.db):
            _, created = self.get_or_create(name=name, defaults={"paused": True, **fields})
            changed = created or bool(
                self.filter(name=name, paused=False).update(paused=True, **fields)
            )
        if changed:
            logger.info("Queue paused queue=%s by=%s", name, safe(by) or "-")
        return changed

    def resume(self, name: str, *, by: str = "") -> bool:
        """Resume the queue ``name``. True if it was paused; False if it was not (nothing is
        written). ValueError if ``name`` is not a valid queue name."""
        validate_queue(name)
        by = str(by)[:BY_MAX_LENGTH]
        changed = bool(
            self.filter(name=name, paused=True).update(
                paused=False,
                paused_at=None,
                paused_by="",
                updated_at=timezone.now(),
                updated_by=by,
            )
        )
        if changed:
            logger.info("Queue resumed queue=%s by=%s", name, safe(by) or "-")
        return changed


class Queue(models.Model):
    """A queue's own state, shared by every worker: whether it is paused, by whom, since
    when, and who changed it last. Queues without a row are not paused. (Settings of a
    queue's own, such as limits, belong here too: one row per queue, read by its claims.)"""

    name = models.CharField(primary_key=True, max_length=QUEUE_MAX_LENGTH)
    paused = models.BooleanField(
        default=False, db_default=False, help_text="No worker claims this queue's jobs."
    )
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_by = models.CharField(
        max_length=BY_MAX_LENGTH,
        blank=True,
        default="",
        help_text="Who paused it (user or caller).",
    )
    updated_at = models.DateTimeField(default=timezone.now)
    updated_by = models.CharField(
        max_length=BY_MAX_LENGTH,
        blank=True,
        default="",
        help_text="Who changed the row last (paused or resumed the queue).",
    )

    objects = QueueQuerySet.as_manager()

    class Meta:
        db_table = "django_gator_queue"
        ordering = ["name"]
        permissions = [("pause_queue", "Can pause and resume queues")]

    def __str__(self) -> str:
        return f"{self.name} (paused)" if self.paused else self.name
