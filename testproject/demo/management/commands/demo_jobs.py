"""``manage.py demo_jobs``: enqueue one of each demo job, showing the ways to dispatch."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.utils import timezone

from demo.jobs import (
    AwardLoyaltyPoints,
    CapturePayment,
    ChargeCard,
    ExportOrders,
    FetchShippingLabel,
    HandlePaymentEvent,
    ImportLegacyOrders,
    RebuildSearchIndex,
    ReserveStock,
    SendInvoice,
    SendLoginCode,
    SendReceipt,
    SendStatement,
    SendWelcomeEmail,
    SyncAccount,
    SyncInventory,
    clear_expired_sessions,
    export_report,
    resize_image,
)
from demo.tour import (
    CallWebhook,
    FetchSource,
    ImportCatalogue,
    MergeSources,
    NotifyOwner,
    PublishAlbum,
    ReindexDocument,
    SendDigest,
    make_thumbnail,
    ping,
)
from django_gator import Batch, Chain, Workflow
from django_gator.models import Job


class Command(BaseCommand):
    help = "Dispatch the demo jobs (run gator_worker to process them)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--worker-started",
            action="store_true",
            help="A worker is started next (make demo, make demo-check): do not say to start one.",
        )

    def handle(self, *args: Any, worker_started: bool, **options: Any) -> None:
        jobs: list[tuple[str, Job]] = []

        # Positional and keyword arguments, stored as JSON on the row.
        jobs.append(("args + kwargs", SendWelcomeEmail.dispatch("ada@example.com", name="Ada")))
        jobs.append(("@job function", resize_image.dispatch(42, width=1200)))
        jobs.append(("bare @job", clear_expired_sessions.dispatch()))

        # Several runs of one job in a single INSERT: lists are positional arguments,
        # dicts keyword arguments.
        for row in resize_image.dispatch_many([[101], [102], {"image_id": 103, "width": 400}]):
            jobs.append(("dispatch_many", row))

        # Scheduled: due in 2 seconds (also: wait=7200, or at=<aware datetime>).
        jobs.append(
            (
                "wait=2s",
                SendWelcomeEmail.dispatch(
                    "grace@example.com",
                    name="Grace",
                    template="reminder",
                    wait=timedelta(seconds=2),
                ),
            )
        )

        # Overriding the class's queue and priority for one dispatch.
        jobs.append(
            (
                "queue/priority override",
                SendWelcomeEmail.dispatch(
                    "alan@example.com", name="Alan", queue="critical", priority=50
                ),
            )
        )

        # Inside a transaction the job row commits (or rolls back) with your own writes,
        # and workers are woken only once it has committed.
        with transaction.atomic():
            jobs.append(("retries, then succeeds", SyncInventory.dispatch("berlin")))

        # retry_decision: a timeout is retried after 1 s; a declined card is dead at once.
        jobs.append(
            (
                "retry_decision: retried",
                ChargeCard.dispatch(order_id=1001, amount_cents=4999, card="tok_flaky"),
            )
        )
        jobs.append(
            (
                "retry_decision: dead",
                ChargeCard.dispatch(order_id=1002, amount_cents=1999, card="tok_declined"),
            )
        )

        # No retry policy and a failing handler: ends `dead`, with its error recorded.
        jobs.append(("always fails", ImportLegacyOrders.dispatch("legacy/orders-2019.csv")))

        # Per-class middleware: rendered in German.
        jobs.append(("middleware", SendInvoice.dispatch(1003, language="de")))

        # A unique job dispatched twice: the second dispatch returns the first row.
        first = RebuildSearchIndex.dispatch("products")
        again = RebuildSearchIndex.dispatch("products")
        assert again.pk == first.pk
        jobs.append(("unique (dispatched twice)", first))

        # An idempotency key: a resent webhook returns the job of the first delivery (for an
        # hour after it finished); a login code that expires if not sent within 10 minutes.
        event = HandlePaymentEvent.dispatch("evt_1001", "charge.succeeded")
        assert HandlePaymentEvent.dispatch("evt_1001", "charge.succeeded").pk == event.pk
        jobs.append(("unique_for (dispatched twice)", event))
        jobs.append(("expires in 10 minutes", SendLoginCode.dispatch("ana@example.com")))

        # A chain: each step is inserted when the previous one succeeds.
        jobs.append(
            ("chain, step 1 of 3", Chain(ReserveStock, CapturePayment, SendReceipt).dispatch(1003))
        )

        # Cancellation: one export cancelled before it starts, one that runs to the end.
        cancelled = ExportOrders.dispatch(batches=50)
        cancelled.cancel()
        jobs.append(("cancelled before it ran", cancelled))
        jobs.append(("checks cancel_requested()", ExportOrders.dispatch(batches=3)))

        # Snooze: the label is published 3 s from now; until then the job snoozes.
        ready_at = (timezone.now() + timedelta(seconds=3)).isoformat()
        jobs.append(("snoozes until ready", FetchShippingLabel.dispatch(1003, ready_at)))

        # Flow control: five syncs of account 7 run one at a time, account 8's meanwhile;
        # six exports, at most two at once (GATOR_QUEUES).
        for account_id in (7, 7, 7, 7, 7, 8):
            jobs.append(("one per account at a time", SyncAccount.dispatch(account_id)))
        for row in export_report.dispatch_many([[n] for n in range(6)]):
            jobs.append(("queue limit: 2 at once", row))

        # An atomic job: its LoyaltyEntry row commits with its success, exactly once.
        jobs.append(("atomic", AwardLoyaltyPoints.dispatch(order_id=1003, points=50)))

        # Encrypted at rest: the row holds ciphertext; the worker and permitted admins see it.
        statement = SendStatement.dispatch("ada@example.com", iban="DE02120300000000202051")
        jobs.append(("encrypted arguments", statement))

        jobs += tour()

        for what, row in jobs:
            self.stdout.write(
                f"  #{row.pk:<5} {row.name:<36} queue={row.queue:<9} "
                f"priority={row.priority:<4} {what}"
            )
        hint = "" if worker_started else " Run `python manage.py gator_worker` to process them."
        self.stdout.write(self.style.SUCCESS(f"Dispatched {len(jobs)} demo jobs.") + hint)


def tour() -> list[tuple[str, Job]]:
    """The jobs of demo/tour.py: debounce, throttle, async, progress, a batch, a workflow."""
    jobs: list[tuple[str, Job]] = []
    # Debounce: three edits of document 5 within the second leave one job, with the last
    # revision, starting a second after the last edit. Throttle: one digest per window.
    for revision in (1, 2, 3):
        edited = ReindexDocument.dispatch(5, revision)
    jobs.append(("debounce (dispatched 3 times)", edited))
    digest = SendDigest.dispatch(7)
    assert SendDigest.dispatch(7).pk == digest.pk
    jobs.append(("throttle (dispatched twice)", digest))
    # Async jobs run on the worker's event loop.
    jobs.append(("async def handle()", CallWebhook.dispatch(12)))
    jobs.append(("async @job function", ping.dispatch("https://example.com/health")))
    # A long-running job: progress and a checkpoint per row (see its page in the admin).
    jobs.append(("progress + checkpoints", ImportCatalogue.dispatch(20)))
    # A batch: PublishAlbum runs once all three thumbnails succeeded, NotifyOwner once they
    # have all ended.
    with Batch(on_success=PublishAlbum, on_complete=NotifyOwner, description="album 7"):
        rows = make_thumbnail.dispatch_many([[1], [2], [3]])
    jobs += [("batch member", row) for row in rows]
    # A workflow: two fetches run in parallel; the merge runs after both, with their results.
    wf = Workflow(name="order 1003")
    erp = wf.add(FetchSource, "erp", 1003, name="fetch_erp")
    shop = wf.add(FetchSource, "shop", 1003, name="fetch_shop")
    wf.add(MergeSources, 1003, after=[erp, shop], name="merge")
    run = wf.dispatch()
    jobs += [("workflow step", row) for row in Job.objects.filter(chain_id=run.pk)]
    return jobs
