"""The worker heartbeat table: one row per live worker process."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Worker(models.Model):
    """A running ``gator_worker`` process; its heartbeat proves it is alive."""

    id = models.CharField(primary_key=True, max_length=255)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list, help_text="[[name, weight], ...]; empty = all.")
    concurrency = models.PositiveIntegerField()
    supervisor = models.CharField(
        max_length=255,
        blank=True,
        default="",
        db_default="",  # rows inserted by workers of an older release
        help_text="Id (host:pid:token) of the `gator_worker --processes` supervisor that "
        "started this worker; empty for a worker started on its own.",
    )
    started_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now)
    wakeup_address = models.CharField(  # noqa: DJ001 - NULL: no socket to wake it on
        max_length=300,
        null=True,
        blank=True,
        help_text="host:port of the UDP socket a dispatch wakes this worker on; "
        "empty when it has none (GATOR_WAKEUP_BIND = None, or PostgreSQL's LISTEN).",
    )

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["heartbeat_at"], name="gator_worker_heartbeat")]

    def __str__(self) -> str:
        return self.id
