"""More demo jobs: the rest of the README's "Beyond run this later" (debounce, throttle,
async jobs, a long-running job with progress, a batch and a fan-out workflow).

Not the ``jobs`` module: ``GATOR_AUTODISCOVER = ["tour"]`` in settings.py makes workers
import each installed app's ``tour`` module too, as they import ``jobs``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from demo.models import LoyaltyEntry
from django_gator import Batch, Queueable, job

# --- Debounce and throttle: windows on a unique key ------------------------------------------


class ReindexDocument(Queueable):
    """Dispatched on every edit: the last edit within a second wins, and runs once."""

    queue = "search"
    debounce = 1  # seconds: a later dispatch replaces the waiting job's arguments

    def unique_key(self, document_id: int, revision: int) -> str:  # one key per document
        return f"document:{document_id}"

    def handle(self, document_id: int, revision: int) -> str:
        return f"document {document_id} indexed at revision {revision}"


class SendDigest(Queueable):
    """At most one digest per user and second, however often it is asked for."""

    queue = "emails"
    unique = True  # the key: the arguments' digest
    throttle = 1  # seconds: at most one start per key per window

    def handle(self, user_id: int) -> str:
        return f"digest sent to user {user_id}"


# --- Async jobs: run on the worker's event loop ----------------------------------------------


class CallWebhook(Queueable):
    """An ``async def handle()``: the async ORM, and awaiting instead of blocking a thread."""

    queue = "webhooks"
    timeout = 10

    async def handle(self, hook_id: int) -> dict[str, Any]:
        entries = await LoyaltyEntry.objects.acount()  # the async ORM
        await asyncio.sleep(0.05)  # an HTTP call would be awaited here
        return {"hook": hook_id, "status": 200, "loyalty_entries": entries}


@job(queue="webhooks")
async def ping(url: str) -> str:
    await asyncio.sleep(0.01)
    return f"pong from {url}"


# --- A long-running job: progress, checkpoints, resumable ------------------------------------


class ImportCatalogue(Queueable):
    """Walks its rows with ``self.each()``: progress (shown in the admin and gator_status)
    and a checkpoint after each, so a retry or a recycled worker resumes where it stopped."""

    queue = "imports"
    stall_timeout = 60  # silent for 60 s: the attempt fails with JobStalled

    def handle(self, rows: int) -> int:
        imported = 0
        for _row in self.each(list(range(rows))):
            imported += 1
        return imported


# --- A batch: fan out, then one callback when all are done -----------------------------------


@job(queue="images")
def make_thumbnail(image_id: int) -> str:
    return f"thumbnails/{image_id}.jpg"


class PublishAlbum(Queueable):
    """``on_success`` of the album's batch: runs once, when every member succeeded."""

    queue = "images"

    def handle(self, batch_id: int) -> dict[str, int]:
        return Batch.objects.get(id=batch_id).counts()


class NotifyOwner(Queueable):
    """``on_complete``: runs once every member has ended, however it ended."""

    queue = "emails"

    def handle(self, batch_id: int) -> str:
        return f"album of batch {batch_id} processed"


# --- A workflow: two fetches in parallel, then a merge of their results ----------------------


class FetchSource(Queueable):
    queue = "orders"

    def handle(self, source: str, order_id: int) -> dict[str, Any]:
        return {"source": source, "order": order_id, "lines": len(source)}


class MergeSources(Queueable):
    queue = "orders"

    def handle(self, order_id: int) -> dict[str, Any]:
        parts = self.results()  # {"fetch_erp": {...}, "fetch_shop": {...}}: the parents' results
        return {"order": order_id, "lines": sum(part["lines"] for part in parts.values())}
