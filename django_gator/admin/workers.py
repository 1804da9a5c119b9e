"""The worker list: the live and recently seen workers, read-only."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.translation import gettext as _

from django_gator.admin.display import time_field
from django_gator.models import Worker


def describe_queues(queues: Any) -> str:
    """A worker's queues as an operator reads them: ``critical (weight 8), default
    (weight 1)``, or ``all queues`` for a worker started without ``-q``. The worker stores
    ``[[name, weight], ...]``; anything else is shown as it is."""
    if not queues:
        return _("all queues")
    if not isinstance(queues, list):
        return json.dumps(queues, ensure_ascii=False)
    parts = []
    for entry in queues:
        if isinstance(entry, list) and len(entry) == 2:
            parts.append(
                _("%(queue)s (weight %(weight)s)") % {"queue": entry[0], "weight": entry[1]}
            )
        else:
            parts.append(
                json.dumps(entry, ensure_ascii=False) if not isinstance(entry, str) else entry
            )
    return ", ".join(parts)


class WorkerAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "supervisor_shown",
        "hostname",
        "pid",
        "queue_list",
        "concurrency",
        "started",
        "heartbeat",
    )
    fields = readonly_fields = list_display
    # The processes of one `gator_worker --processes` supervisor next to each other, after
    # the workers started on their own.
    ordering = ("supervisor", "-started_at")
    list_filter = ("supervisor",)
    search_fields = ("id", "supervisor", "hostname")

    started = time_field("started_at", "started at")
    heartbeat = time_field("heartbeat_at", "heartbeat at")

    @admin.display(description="supervisor", ordering="supervisor")
    def supervisor_shown(self, worker: Worker) -> str:
        """The ``--processes`` supervisor that started this worker, or "-"."""
        return worker.supervisor or "-"

    @admin.display(description="queues")
    def queue_list(self, worker: Worker) -> str:
        """The queues and their weights as words, not as the stored JSON."""
        return describe_queues(worker.queues)

    # Rows are written by the workers' heartbeats only.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
