"""``manage.py demo_check``: verify that the demo jobs ended the way they are meant to.

Meant for a fresh database on which ``demo_jobs`` ran once and workers then processed
everything (``make demo-check`` does exactly that). Also logs in to the admin with the test
client. Exits non-zero, listing every problem, if anything is off.

``manage.py demo_check --unfinished`` only prints how many jobs are not finished yet
(waiting, running or failed-and-going-to-retry).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.test import Client
from django.test.utils import setup_test_environment
from django.urls import reverse

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
from demo.management.commands.demo_superuser import PASSWORD, USERNAME
from demo.models import LoyaltyEntry
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
from django_gator import encryption
from django_gator.models import Job, JobState

UNFINISHED = (JobState.WAITING, JobState.RUNNING, JobState.FAILED)

# How many rows of each job `demo_jobs` creates.
EXPECTED_COUNTS = {
    SendWelcomeEmail.name: 3,
    resize_image.name: 4,
    clear_expired_sessions.name: 1,
    SyncInventory.name: 1,
    ChargeCard.name: 2,
    ImportLegacyOrders.name: 1,
    SendInvoice.name: 1,
    RebuildSearchIndex.name: 1,
    HandlePaymentEvent.name: 1,
    SendLoginCode.name: 1,
    ReserveStock.name: 1,
    CapturePayment.name: 1,
    SendReceipt.name: 1,
    ExportOrders.name: 2,
    AwardLoyaltyPoints.name: 1,
    FetchShippingLabel.name: 1,
    SendStatement.name: 1,
    # Flow control: one sync per account at a time, at most 2 exports at once.
    SyncAccount.name: 6,
    export_report.name: 6,
    # demo/tour.py: debounced and throttled (one row each), async, long-running, a batch
    # of three with its two callbacks, a workflow of three steps.
    ReindexDocument.name: 1,
    SendDigest.name: 1,
    CallWebhook.name: 1,
    ping.name: 1,
    ImportCatalogue.name: 1,
    make_thumbnail.name: 3,
    PublishAlbum.name: 1,
    NotifyOwner.name: 1,
    FetchSource.name: 2,
    MergeSources.name: 1,
}


def expected_outcome(job: Job) -> tuple[str, int, list[str]]:
    """(final state, attempts, classes of the recorded errors) that ``job`` should end with."""
    if job.name == SyncInventory.name:
        return JobState.SUCCEEDED, 3, ["ConnectionError", "ConnectionError"]
    if job.name == ChargeCard.name and job.kwargs.get("card") == "tok_flaky":
        return JobState.SUCCEEDED, 2, ["demo.jobs.GatewayTimeout"]
    if job.name == ChargeCard.name:
        return JobState.DEAD, 1, ["demo.jobs.CardDeclined"]
    if job.name == ImportLegacyOrders.name:
        return JobState.DEAD, 1, ["ValueError"]
    if job.name == ExportOrders.name and job.kwargs.get("batches") == 50:
        return JobState.CANCELLED, 0, []
    return JobState.SUCCEEDED, 1, []


class Command(BaseCommand):
    help = "Check that the demo jobs reached their expected states and that the admin loads."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--unfinished",
            action="store_true",
            help="Only print the number of jobs that are not finished yet.",
        )

    def handle(self, *args: Any, unfinished: bool, **options: Any) -> None:
        if unfinished:
            self.stdout.write(str(Job.objects.filter(state__in=UNFINISHED).count()))
            return
        problems = self.check_jobs() + self.check_admin()
        if problems:
            for problem in problems:
                self.stderr.write(f"  FAIL: {problem}")
            raise CommandError(f"demo check failed: {len(problems)} problem(s)")
        self.stdout.write(self.style.SUCCESS("demo check passed"))

    def check_jobs(self) -> list[str]:
        problems = []
        jobs = list(Job.objects.order_by("id"))
        counts: dict[str, int] = {}
        for job in jobs:
            counts[job.name] = counts.get(job.name, 0) + 1
        if counts != EXPECTED_COUNTS:
            problems.append(f"jobs per name are {counts}, expected {EXPECTED_COUNTS}")

        for job in jobs:
            state, attempts, error_classes = expected_outcome(job)
            errors = job.error_history
            got_classes = [str(e.get("class")) for e in errors]
            line = (
                f"#{job.pk} {job.name}{job.args}{job.kwargs}: state={job.state} "
                f"attempts={job.attempts} errors={got_classes}"
            )
            self.stdout.write(f"  {line}")
            if job.state != state:
                problems.append(f"{line}: expected state {state}")
            if job.attempts != attempts:
                problems.append(f"{line}: expected {attempts} attempt(s)")
            if got_classes != error_classes:
                problems.append(f"{line}: expected errors {error_classes}")
            for entry in errors:
                missing = [k for k in ("message", "traceback", "at", "worker") if not entry.get(k)]
                if missing:
                    problems.append(f"{line}: error entry lacks {missing}: {entry}")
            if state == JobState.DEAD and not job.last_error:
                problems.append(f"{line}: dead without last_error")
            if state == JobState.SUCCEEDED and job.finished_at is None:
                problems.append(f"{line}: succeeded without finished_at")

        problems += self.check_dispatch_options(jobs)
        problems += self.check_features(jobs)
        problems += check_tour(jobs)
        return problems

    def check_features(self, jobs: list[Job]) -> list[str]:
        problems = []
        results = {job.name: job.result for job in jobs if job.state == JobState.SUCCEEDED}
        if results.get(SendInvoice.name) != "invoice for order 1003 rendered in de":
            problems.append(f"SendInvoice result {results.get(SendInvoice.name)!r}: middleware?")
        steps = (ReserveStock.name, CapturePayment.name, SendReceipt.name)
        chain = [job for job in jobs if job.name in steps]
        if (
            sorted(job.chain_position or 0 for job in chain) != [0, 1, 2]
            or len({job.chain_id for job in chain}) != 1
        ):
            problems.append(f"the chain's rows are {[(j.name, j.chain_position) for j in chain]}")
        statement = next((job for job in jobs if job.name == SendStatement.name), None)
        if statement is not None and (
            "ada@example.com" in json.dumps([statement.args, statement.kwargs, statement.result])
            or not encryption.is_sealed(statement.args)
        ):
            problems.append(f"#{statement.pk} {statement.name}: its row is not encrypted")
        entries = list(LoyaltyEntry.objects.values_list("order_id", "points"))
        if entries != [(1003, 50)]:
            problems.append(f"loyalty entries are {entries}, expected [(1003, 50)]")
        label = next((job for job in jobs if job.name == FetchShippingLabel.name), None)
        # It snoozes while it runs before its label's time; a worker that first ran it after
        # that time (a slow start on a busy machine) rightly found the label at once.
        if (
            label is not None
            and label.snoozes < 1
            and label.started_at is not None
            and label.started_at < datetime.fromisoformat(label.args[1])
        ):
            problems.append(
                f"#{label.pk} {label.name} ran at {label.started_at.isoformat()}, before its "
                f"label's time {label.args[1]}, and never snoozed (snoozes={label.snoozes})"
            )
        return problems

    def check_dispatch_options(self, jobs: list[Job]) -> list[str]:
        problems = []
        for job in jobs:
            welcome = job.name == SendWelcomeEmail.name
            # wait=2s: not started before it was due.
            if (
                welcome
                and job.kwargs.get("template") == "reminder"
                and (
                    job.started_at is None
                    or job.started_at - job.created_at < timedelta(seconds=1.9)
                )
            ):
                problems.append(
                    f"#{job.pk}: dispatched with wait=2s but created {job.created_at}, "
                    f"started {job.started_at}"
                )
            if (
                welcome
                and job.kwargs.get("name") == "Alan"
                and (job.queue, job.priority) != ("critical", 50)
            ):
                problems.append(
                    f"#{job.pk}: dispatched with queue='critical', priority=50 but has "
                    f"queue={job.queue!r}, priority={job.priority}"
                )
            if job.name == SyncInventory.name and job.queue != "retries":
                problems.append(f"#{job.pk}: retried job should be on 'retries', is {job.queue!r}")
            if job.name == resize_image.name and job.queue != "images":
                problems.append(f"#{job.pk}: resize_image should be on 'images', is {job.queue!r}")
        return problems

    def check_admin(self) -> list[str]:
        problems = []
        setup_test_environment()  # lets the test client's host "testserver" in
        client = Client()
        response = client.get("/")
        if response.status_code not in (301, 302) or response["Location"] != "/admin/":
            problems.append(f"GET / should redirect to /admin/, got {response.status_code}")
        response = client.get(reverse("admin:login"))
        if response.status_code != 200 or b"Log in" not in response.content:
            problems.append(f"admin login page: HTTP {response.status_code}")
        else:
            self.stdout.write("  admin login page loads")
        if not client.login(username=USERNAME, password=PASSWORD):
            problems.append(f"cannot log in to the admin as {USERNAME}/{PASSWORD}")
            return problems
        urls = [reverse("admin:index")]
        if admin.site.is_registered(Job):
            urls.append(reverse("admin:django_gator_job_changelist"))
            urls.append(reverse("admin:django_gator_job_dead"))
            urls.append(reverse("admin:django_gator_job_dashboard"))
            urls.append(reverse("admin:django_gator_schedule_changelist"))
            urls += [
                reverse("admin:django_gator_job_change", args=[j.pk]) for j in Job.objects.all()
            ]
        for url in urls:
            response = client.get(url)
            if response.status_code != 200:
                problems.append(f"GET {url} as {USERNAME}: HTTP {response.status_code}")
        self.stdout.write(f"  admin: logged in as {USERNAME!r}, {len(urls)} page(s) load")
        return problems


def check_tour(jobs: list[Job]) -> list[str]:
    """The jobs of demo/tour.py ended as their features say."""
    by_name = {job.name: job for job in jobs}
    expected = {
        # Debounce: the last of three dispatches' arguments won.
        ReindexDocument.name: "document 5 indexed at revision 3",
        SendDigest.name: "digest sent to user 7",
        CallWebhook.name: {"hook": 12, "status": 200},
        ping.name: "pong from https://example.com/health",
        ImportCatalogue.name: 20,
        PublishAlbum.name: {"succeeded": 3, "dead": 0, "cancelled": 0, "total": 3},
        # A workflow's merge reads its parents' results (3 + 4 lines); wait_result()
        # returns a finished job's value at once (or waits for it, or raises its error).
        MergeSources.name: {"order": 1003, "lines": 7},
    }
    problems = []
    for name, value in expected.items():
        job = by_name.get(name)
        got = job.wait_result(timeout=5) if job is not None else None
        if isinstance(value, dict) and isinstance(got, dict):
            got = {key: got.get(key) for key in value}
        if got != value:
            problems.append(f"{name}: result {got!r}, expected {value!r}")
    progress = by_name[ImportCatalogue.name].progress if ImportCatalogue.name in by_name else None
    if not progress or (progress.get("done"), progress.get("total")) != (20, 20):
        problems.append(f"{ImportCatalogue.name}: progress {progress!r}, expected 20 of 20")
    return problems
