"""Jobs that ended, per minute and queue, as the workers counted them: what the
dashboard's hour chart and the queue figures' last-hour counts read (see
:mod:`django_gator.tallies`)."""

from __future__ import annotations

from django.db import models

from django_gator.validation import QUEUE_MAX_LENGTH


class FinishedTally(models.Model):
    """Attempts that ended succeeded or dead in one minute, in one queue, counted by one
    worker between two of its heartbeats (several rows may share a minute and queue: a
    reader sums them)."""

    id = models.BigAutoField(primary_key=True)
    minute = models.DateTimeField(help_text="The minute the attempts ended in (UTC).")
    queue = models.CharField(max_length=QUEUE_MAX_LENGTH)
    succeeded = models.PositiveIntegerField(default=0)
    dead = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "django_gator_finished_tally"
        indexes = [models.Index(fields=["minute"], name="gator_tally_minute")]

    def __str__(self) -> str:
        return f"{self.queue} at {self.minute:%Y-%m-%d %H:%M}: {self.succeeded}/{self.dead}"
