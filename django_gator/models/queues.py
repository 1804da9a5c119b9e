"""The queue table: one row per queue that was paused, given limits, or claimed under a
limit.

A queue exists as soon as a job names it; it has a row here only once someone paused it or
gave it limits (``GATOR_QUEUES``, the admin), or a worker claimed jobs of a limited class
from it (the limited claim locks the row). The claim statement of every engine reads the row
of the queue it claims from (a primary-key probe), so a pause or a limit committed here
reaches every worker on every machine at its next claim, with no cache to expire.

Limits: ``GATOR_QUEUES`` seeds the rows (each worker writes it at start, see
:meth:`QueueQuerySet.sync_settings`); an operator's edit in the admin overrides it and is
kept, with who and when (``limits_by``, ``limits_at``), until the operator gives the queue
back to the settings (which the next worker start writes again).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from django_gator.limits import RATE_MAX_LENGTH, Rate, parse_rate, validate_concurrency
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

    def limited_names(self) -> list[str]:
        """The queues with a concurrency or rate limit."""
        return list(
            self.filter(models.Q(concurrency__isnull=False) | ~models.Q(rate_limit=""))
            .order_by("name")
            .values_list("name", flat=True)
        )

    def sync_settings(self, table: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """Write ``GATOR_QUEUES`` (``table``, validated) into the rows whose limits no
        operator has set: the queues it names get its limits, the other such rows lose
        theirs. Rows an operator edited (``limits_by``) are left alone. Returns the names
        of the rows changed."""
        changed = []
        now = timezone.now()
        with transaction.atomic(using=self.db):
            for name, options in sorted(table.items()):
                concurrency = validate_concurrency(options.get("concurrency"))
                rate = parse_rate(options.get("rate_limit"))
                rate_text = "" if rate is None else str(rate)
                row, created = self.get_or_create(
                    name=name,
                    defaults={"concurrency": concurrency, "rate_limit": rate_text},
                )
                if created:
                    changed.append(name)
                elif not row.limits_by and (row.concurrency, row.rate_limit) != (
                    concurrency,
                    rate_text,
                ):
                    self.filter(name=name, limits_by="").update(
                        concurrency=concurrency, rate_limit=rate_text, updated_at=now
                    )
                    changed.append(name)
            stale = (
                self.filter(limits_by="")
                .exclude(name__in=list(table))
                .filter(models.Q(concurrency__isnull=False) | ~models.Q(rate_limit=""))
            )
            names = list(stale.values_list("name", flat=True))
            if names:
                stale.update(concurrency=None, rate_limit="", updated_at=now)
                changed += names
        return changed

    def set_limits(
        self, name: str, *, concurrency: int | None, rate_limit: str | None, by: str = ""
    ) -> Queue:
        """An operator's limits for the queue ``name`` (None: no limit); they override
        ``GATOR_QUEUES`` until :meth:`use_settings`. ValueError names a bad value."""
        validate_queue(name)
        concurrency = validate_concurrency(concurrency)
        rate = parse_rate(rate_limit)
        by = str(by)[:BY_MAX_LENGTH] or "-"
        now = timezone.now()
        fields = {
            "concurrency": concurrency,
            "rate_limit": "" if rate is None else str(rate),
            "limits_by": by,
            "limits_at": now,
            "updated_at": now,
            "updated_by": by,
        }
        with transaction.atomic(using=self.db):
            row, created = self.get_or_create(name=name, defaults=fields)
            if not created:
                self.filter(name=name).update(**fields)
                row.refresh_from_db()
        logger.info(
            "Queue limits set queue=%s concurrency=%s rate_limit=%s by=%s",
            name,
            concurrency if concurrency is not None else "-",
            fields["rate_limit"] or "-",
            safe(by),
        )
        return row

    def use_settings(
        self, name: str, table: Mapping[str, Mapping[str, Any]], *, by: str = ""
    ) -> None:
        """Give the queue ``name``'s limits back to ``GATOR_QUEUES`` (``table``)."""
        options = table.get(name, {})
        rate = parse_rate(options.get("rate_limit"))
        self.filter(name=name).update(
            concurrency=validate_concurrency(options.get("concurrency")),
            rate_limit="" if rate is None else str(rate),
            limits_by="",
            limits_at=None,
            updated_at=timezone.now(),
            updated_by=str(by)[:BY_MAX_LENGTH],
        )
        logger.info("Queue limits from settings queue=%s by=%s", name, safe(by) or "-")


class Queue(models.Model):
    """A queue's own state, shared by every worker: whether it is paused (by whom, since
    when), its limits (from ``GATOR_QUEUES`` or an operator), and who changed it last.
    Queues without a row are neither paused nor limited."""

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

    concurrency = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="At most this many of its jobs run at once, across every worker (empty: "
        "no limit).",
    )
    rate_limit = models.CharField(
        max_length=RATE_MAX_LENGTH,
        blank=True,
        default="",
        db_default="",
        help_text='At most this many of its jobs start in any window: "10/s", "100/m", '
        '"1000/h" (empty: no limit).',
    )
    limits_by = models.CharField(
        max_length=BY_MAX_LENGTH,
        blank=True,
        default="",
        db_default="",
        help_text="Who set the limits in the admin (empty: they come from GATOR_QUEUES).",
    )
    limits_at = models.DateTimeField(null=True, blank=True)

    objects = QueueQuerySet.as_manager()

    class Meta:
        db_table = "django_gator_queue"
        ordering = ["name"]
        permissions = [("pause_queue", "Can pause and resume queues")]

    def __str__(self) -> str:
        return f"{self.name} (paused)" if self.paused else self.name

    @property
    def rate(self) -> Rate | None:
        return parse_rate(self.rate_limit)

    @property
    def limited(self) -> bool:
        return self.concurrency is not None or bool(self.rate_limit)
