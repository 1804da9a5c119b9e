"""The ledger of starts under a rate limit: one row per job started in a rate-limited scope
(a queue, a job class, or a class's key), pruned as its window passes.

A job's ``started_at`` cannot serve: it is the first attempt's start, and a retried job is
started again. The limited claim (``engines/flow.py``) counts the rows of a scope younger
than its window, inserts one per job it starts, and deletes those older than the window.
"""

from __future__ import annotations

from django.db import models

#: Longest scope: ``job:`` + a job name (255) + ``|`` + a key (200).
SCOPE_MAX_LENGTH = 500


class FlowStart(models.Model):
    """One start counted against a rate limit."""

    id = models.BigAutoField(primary_key=True)
    scope = models.CharField(max_length=SCOPE_MAX_LENGTH)
    started_at = models.DateTimeField()

    class Meta:
        db_table = "django_gator_flow_start"
        indexes = [models.Index(fields=["scope", "started_at"], name="gator_flow_start_scope")]

    def __str__(self) -> str:
        return f"{self.scope} at {self.started_at}"
