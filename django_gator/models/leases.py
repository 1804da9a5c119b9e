"""Leases: a named duty that one worker of the fleet holds at a time, until it expires.

The automatic pruner is the first holder (``Lease.PRUNE``): every worker may prune, but only
the one holding the lease does, so a fleet of a hundred workers deletes with one connection.
A lease is a row, taken and renewed by one conditional UPDATE (free, expired, or already
ours), which PostgreSQL, MariaDB/MySQL and SQLite all serialise on the row: no advisory
locks, no session state (it works behind a transaction-pooling PgBouncer too). A holder
that dies simply stops renewing; the lease is free again when it expires.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import IntegrityError, models, transaction
from django.db.models import Q


class LeaseQuerySet(models.QuerySet["Lease"]):
    def take(self, name: str, holder: str, *, now: datetime, seconds: float) -> bool:
        """Take (or renew) the lease ``name`` for ``holder`` until ``now + seconds``; True
        if ``holder`` holds it now. ``now`` is the database's time (every holder compares
        against the same clock)."""
        until = now + timedelta(seconds=seconds)
        free = Q(expires_at__lt=now) | Q(holder=holder)
        if self.filter(free, name=name).update(holder=holder, expires_at=until):
            return True
        try:
            with transaction.atomic(using=self.db):
                self.create(name=name, holder=holder, expires_at=until)
        except IntegrityError:
            return False  # another holder's row (it exists and is not free)
        return True


class Lease(models.Model):
    #: The automatic pruning of finished jobs (worker/pruner.py).
    PRUNE = "prune"

    name = models.CharField(max_length=64, primary_key=True)
    holder = models.CharField(max_length=255, help_text="The worker id that holds it.")
    expires_at = models.DateTimeField(help_text="Free for another holder after this time.")

    objects = LeaseQuerySet.as_manager()

    class Meta:
        db_table = "django_gator_lease"

    def __str__(self) -> str:
        return f"{self.name} held by {self.holder} until {self.expires_at:%Y-%m-%d %H:%M:%S}"
