"""The demo's jobs: one per django-gator feature.

django_gator imports every installed app's ``jobs`` module at startup (like ``admin.py``), so
defining a job here is all it takes for a worker to know it. Each job's registered name is
``"<module>.<name>"``, e.g. ``"demo.jobs.SendWelcomeEmail"``: that name and the JSON
arguments are all that is stored in the database.

``manage.py demo_jobs`` dispatches them; ``manage.py gator_worker`` runs them. Every job is
quick, so a burst worker (``gator_worker --burst``) finishes them in seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.contrib.sessions.models import Session
from django.core.mail import send_mail
from django.dispatch import receiver
from django.utils import timezone, translation

from demo.models import LoyaltyEntry
from django_gator import Cron, JobCancelled, Queueable, Retry, Snooze, job
from django_gator.signals import job_finished

logger = logging.getLogger(__name__)


# --- A class-based job: queue, priority and timeout ----------------------------------------------


class SendWelcomeEmail(Queueable):
    """Email a new user. The class attributes are the defaults of every dispatch."""

    queue = "emails"  # workers can be told which queues to serve: gator_worker -q emails
    priority = 10  # higher runs first within a queue (-100 to 100, default 0)
    timeout = 30  # seconds a run may take, None = no limit (docs/explanation/worker.md)

    def handle(self, email: str, name: str = "there", template: str = "welcome") -> dict[str, Any]:
        # self.job_id, self.attempt (1 on the first run) and self.queue describe this run.
        subject = "Welcome aboard!" if template == "welcome" else "Still there?"
        send_mail(
            subject,
            f"Hi {name},\n\nthanks for signing up.\n\n(job #{self.job_id}, {template!r})",
            "noreply@example.com",
            [email],
        )
        logger.info("Sent %r email to %s (job #%s)", template, email, self.job_id)
        # A JSON-serialisable return value is stored on the job row (Job.result).
        return {"to": email, "template": template}


# --- Function jobs: @job and @job(...) -----------------------------------------------------------


@job(queue="images", timeout=60)
def resize_image(image_id: int, width: int = 800) -> dict[str, int]:
    """Make a thumbnail. ``resize_image(1)`` still calls the function directly;
    ``resize_image.dispatch(1)`` runs it in a worker."""
    # A real job would load the image, resize it and save it; we only work out the size.
    height = width * 3 // 4
    logger.info("Resized image %s to %sx%s", image_id, width, height)
    return {"image_id": image_id, "width": width, "height": height}


@job(schedule=Cron("0 4 * * *", timezone="Europe/Berlin"))
def clear_expired_sessions() -> int:
    """Housekeeping, dispatched by the workers' scheduler every night at 04:00 Berlin time
    (and by ``demo_jobs`` once). Queue "default", no retries."""
    deleted, _ = Session.objects.filter(expire_date__lt=timezone.now()).delete()
    logger.info("Deleted %s expired sessions", deleted)
    return deleted


# --- Retries: a flaky dependency -----------------------------------------------------------------


class SyncInventory(Queueable):
    """Pull stock levels from a warehouse API that times out now and then.

    On failure the job goes to ``failed`` and runs again ``interval`` seconds later, at most
    ``max_retries`` more times, on the "retries" queue (so retries cannot crowd out fresh
    work). Every failed attempt's error is kept in the job's error history.
    """

    retry = Retry(interval=1, max_retries=3, queue="retries")

    def handle(self, warehouse: str) -> dict[str, Any]:
        # Simulated outage: the first two attempts fail, the third gets through.
        if self.attempt < 3:
            raise ConnectionError(
                f"warehouse {warehouse!r}: API timed out (simulated, attempt {self.attempt})"
            )
        logger.info("Synced inventory of %s on attempt %s", warehouse, self.attempt)
        return {"warehouse": warehouse, "attempt": self.attempt}


# --- retry_decision: choosing per error whether and when to retry --------------------------------


class CardDeclined(Exception):
    """The bank said no: trying again will not change its mind."""


class GatewayTimeout(Exception):
    """The payment gateway did not answer: worth another try soon."""


class ChargeCard(Queueable):
    """Charge an order. The class policy is exponential backoff (30 s, 31 s, 62 s, ...), but
    ``retry_decision`` looks at the error first."""

    queue = "payments"
    priority = 20
    retry = Retry(interval="exponential", max_retries=5)

    def handle(self, order_id: int, amount_cents: int, card: str) -> dict[str, Any]:
        # Stand-in for a payment gateway client; the card token picks the outcome.
        if card == "tok_declined":
            raise CardDeclined(f"order {order_id}: card declined (insufficient funds)")
        if card == "tok_flaky" and self.attempt == 1:
            raise GatewayTimeout(f"order {order_id}: gateway did not answer within 10 s")
        logger.info("Charged %s cents for order %s", amount_cents, order_id)
        return {"order_id": order_id, "charged_cents": amount_cents}

    def retry_decision(self, exc: BaseException, retry_count: int) -> float | bool | None:
        if isinstance(exc, CardDeclined):
            return False  # dead now, retries or not
        if isinstance(exc, GatewayTimeout):
            return 1  # seconds: the gateway blips are short, don't wait 30 s
        return None  # anything else: the class's Retry policy (exponential)


# --- A job that always fails ---------------------------------------------------------------------


class ImportLegacyOrders(Queueable):
    """Import a CSV export from the old shop. The file has a bad row, so this always fails.

    No ``retry`` policy: the first failure sends the job straight to ``dead``, with the error
    (class, message, traceback, time, worker) recorded. Fix the data, then retry it from the
    admin.
    """

    queue = "imports"

    def handle(self, path: str) -> None:
        raise ValueError(f"{path}, row 3: invalid date '2019-02-31' in column 'ordered_at'")

    def on_error(self, exc: BaseException) -> None:
        # Runs in the worker after each failed attempt; if it raised, the error would be
        # logged and the failure recorded all the same.
        logger.error("Legacy import failed, tell the data team: %s", exc)


# --- Middleware: code wrapped around handle() ----------------------------------------------------


def log_duration(job: Queueable, call_next: Callable[[], Any]) -> Any:
    """Global middleware (GATOR_MIDDLEWARE in testproject/settings.py): times every job."""
    started = time.perf_counter()
    try:
        return call_next()
    finally:
        logger.debug(
            "%s #%s took %.1f ms", job.name, job.job_id, (time.perf_counter() - started) * 1000
        )


def in_customer_language(job: Queueable, call_next: Callable[[], Any]) -> Any:
    """Per-class middleware: run the job in the language it was dispatched with."""
    with translation.override(job.kwargs.get("language", "en")):
        return call_next()


class SendInvoice(Queueable):
    queue = "emails"
    middleware = [in_customer_language]

    def handle(self, order_id: int, language: str = "en") -> str:
        return f"invoice for order {order_id} rendered in {translation.get_language()}"


# --- Signals: watch every job from one place -----------------------------------------------------


@receiver(job_finished, sender=ChargeCard)
def alert_on_dead_payment(sender: type, job: Queueable, state: str, **kwargs: Any) -> None:
    if state == "dead":
        order_id = job.kwargs.get("order_id")
        logger.warning("Payment job #%s is dead; order %s needs a look", job.job_id, order_id)


# --- Unique jobs: one pending run per key --------------------------------------------------------


class RebuildSearchIndex(Queueable):
    """Dispatching it again while one run is waiting (or running) returns that run: ten saves
    in a row cost one rebuild, not ten."""

    unique = True  # the key is the arguments; or define unique_key(self, section)

    def handle(self, section: str) -> str:
        return f"rebuilt the {section} index"


class HandlePaymentEvent(Queueable):
    """A payment provider's webhook, dispatched blindly by the view: the provider resends an
    event it is not sure we got, and for an hour after the first one finished, a resend
    returns that job instead of handling the event twice."""

    unique_for = timedelta(hours=1)

    def unique_key(self, event_id: str, kind: str) -> str:
        return f"event:{event_id}"

    def handle(self, event_id: str, kind: str) -> str:
        return f"handled {kind} {event_id}"


class SendLoginCode(Queueable):
    """A one-time login code: useless ten minutes after it was asked for, so a job that has
    not started by then (workers down, a long backlog) is never run."""

    expires = timedelta(minutes=10)

    def handle(self, email: str) -> str:
        return f"sent a code to {email}"


# --- Chains: steps that run one after the other --------------------------------------------------


class ReserveStock(Queueable):
    queue = "orders"

    def handle(self, order_id: int) -> str:
        return f"reserved stock for order {order_id}"


class CapturePayment(Queueable):
    queue = "orders"
    retry = Retry(interval=1, max_retries=3)

    def handle(self, order_id: int) -> str:
        return f"captured payment for order {order_id}"


class SendReceipt(Queueable):
    queue = "orders"

    def handle(self, order_id: int) -> str:
        return f"sent the receipt for order {order_id}"


# --- Cancellation: a long job that stops when asked ----------------------------------------------


class ExportOrders(Queueable):
    """Writes an export in batches and checks between them whether an operator cancelled it
    (Job.cancel() or the admin's cancel action on the running row)."""

    queue = "exports"

    def handle(self, batches: int = 5) -> int:
        for done in range(batches):
            if self.cancel_requested():
                raise JobCancelled(f"export stopped after {done} batches")
            time.sleep(0.05)  # stand-in for writing one batch
        return batches


# --- Snooze: "not now, ask again later", without spending an attempt ----------------------------


class FetchShippingLabel(Queueable):
    """The carrier publishes a shipment's label a little while after it is booked. Until
    then the job snoozes: it goes back to waiting and asks again later, spending no attempt
    and recording no error (the admin shows how many times it snoozed)."""

    queue = "shipping"

    def handle(self, shipment_id: int, ready_at: str) -> str:
        wait = (datetime.fromisoformat(ready_at) - timezone.now()).total_seconds()
        if wait > 0:
            raise Snooze(min(wait, 1.0))  # ask again in at most a second
        return f"label for shipment {shipment_id}"


# --- Flow control: limits that hold across every worker -----------------------------------------


class SyncAccount(Queueable):
    """Sync one customer account with the CRM: never two syncs of the same account at once,
    and at most 100 calls a minute per account (the CRM's quota). A backlog of one account
    never holds up the others."""

    queue = "crm"
    concurrency_limit = 1  # at most 1 running per key, across every worker
    rate_limit = "100/m"  # "N/s", "N/m", "N/h"; per key, since concurrency_key is defined

    def concurrency_key(self, account_id: int) -> str:
        return f"account:{account_id}"  # computed at dispatch, stored on the row

    def handle(self, account_id: int) -> str:
        time.sleep(0.1)  # the CRM call
        return f"account {account_id} synced"


@job(queue="exports")  # GATOR_QUEUES in settings.py: at most 2 exports at once, 10 starts/s
def export_report(report_id: int) -> int:
    time.sleep(0.2)  # building the file
    return report_id


# --- Atomic jobs: effects and success commit together --------------------------------------------


class AwardLoyaltyPoints(Queueable):
    """The points row and the job's success mark commit in one transaction: if the worker
    dies halfway, neither happened and the retry awards the points exactly once."""

    atomic = True
    retry = Retry(interval=1, max_retries=3)

    def handle(self, order_id: int, points: int) -> int:
        LoyaltyEntry.objects.create(order_id=order_id, points=points)
        return points


# --- Encrypted jobs: personal data encrypted at rest ---------------------------------------------


class SendStatement(Queueable):
    """Its arguments, result and errors are stored encrypted (GATOR_ENCRYPTION_KEYS in
    settings.py, from the environment); the admin shows them to users with the
    django_gator.view_encrypted permission only."""

    encrypted = True

    def handle(self, email: str, iban: str) -> dict[str, str]:
        logger.info("Statement sent")  # never log the personal data itself
        return {"sent_to": email, "account_ends": iban[-4:]}
