"""The counters of weighted fair share: per fair queue and fairness key, the stamp of the
key's latest job (see django_gator.fairness and docs/fairness.md).

Dispatch moves a counter forward in its INSERT's transaction, by ``count / weight`` from
the later of its value and the queue's virtual time; concurrent dispatches of one key take
turns on its row. A counter behind its queue's virtual time says nothing the virtual time
does not: the upkeep deletes those.
"""

from __future__ import annotations

from django.db import models

from django_gator.fairness import KEY_MAX_LENGTH


class FairShare(models.Model):
    """The latest stamp given to a fairness key's jobs in a fair queue."""

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=100)
    fairness_key = models.CharField(max_length=KEY_MAX_LENGTH, blank=True)
    last_stamp = models.FloatField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "django_gator_fair_share"
        constraints = [
            models.UniqueConstraint(fields=["queue", "fairness_key"], name="gator_fair_share_key")
        ]

    def __str__(self) -> str:
        return f"{self.queue} {self.fairness_key!r} at {self.last_stamp}"
