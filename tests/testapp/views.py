"""Async views that dispatch jobs (tests/test_async_dispatch.py)."""

from __future__ import annotations

from asgiref.sync import async_to_sync, sync_to_async
from django.db import transaction
from django.http import HttpRequest, JsonResponse

from django_gator import Chain
from django_gator.models import Job
from tests.testapp.jobs import AsyncSleep, async_add
from tests.testapp.models import Execution


class Rollback(Exception):
    pass


async def dispatch_view(request: HttpRequest) -> JsonResponse:
    """adispatch, adispatch_many and Chain.adispatch straight from an async view."""
    one = await AsyncSleep.adispatch(0.0)
    many = await async_add.adispatch_many([[1, 2], {"a": 3, "b": 4}])
    chained = await Chain(AsyncSleep, AsyncSleep).adispatch(0.0)
    return JsonResponse({"ids": [one.pk, *(j.pk for j in many), chained.pk]})


async def dispatch_in_transaction_view(request: HttpRequest) -> JsonResponse:
    """adispatch inside transaction.atomic() (entered in a sync function, as async code
    must), committed or rolled back; with ?on_commit=1 the INSERT waits for the commit."""
    rollback = request.GET.get("rollback") == "1"
    on_commit = request.GET.get("on_commit") == "1"
    seen: dict[str, object] = {}

    def in_transaction() -> None:
        try:
            with transaction.atomic():
                Execution.objects.create(job_id=0, attempt=0, pid=0, label="view")
                job = async_to_sync(AsyncSleep.adispatch)(0.0, on_commit=on_commit)
                seen["id_inside"] = job.pk
                # The INSERT ran on this thread's connection, inside this transaction.
                seen["rows_inside"] = Job.objects.filter(name=AsyncSleep.name).count()
                seen["job"] = job
                if rollback:
                    raise Rollback
        except Rollback:
            pass

    await sync_to_async(in_transaction)()
    job = seen.pop("job")
    seen["id_after"] = job.pk  # type: ignore[attr-defined]
    return JsonResponse(seen)
