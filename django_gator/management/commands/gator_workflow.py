"""``manage.py gator_workflow signal RUN_ID NAME [--payload JSON] | retry RUN_ID | cancel
RUN_ID``: deliver a signal to a workflow's wait step (see ``Workflow.add_wait``), retry a
workflow from its failed steps, or cancel it."""

from __future__ import annotations

import getpass
import json
import socket
import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_gator.exceptions import WorkflowError
from django_gator.validation import check_json


class Command(BaseCommand):
    help = (
        "signal RUN_ID NAME: deliver the signal NAME to the workflow RUN_ID (the id its "
        "WorkflowRun row and its jobs' chain_id carry); its wait step for NAME succeeds with "
        "the payload (--payload, JSON; default null) as its result, and the steps after it "
        "are released. A signal sent before its wait step is reached is kept for it. A "
        "second signal of the same name changes nothing and says so (exit 0). An unknown "
        "workflow, a NAME it does not wait for, or a wait that has ended is an error "
        "(exit 1). retry RUN_ID: the workflow's dead and failed jobs are due again (the steps "
        "that succeeded keep their results; what a dead step cancelled runs once it "
        "succeeds). cancel RUN_ID: its jobs not started and its steps not released end "
        "cancelled; running ones are asked to stop."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        from django_gator.management.arguments import add_database_option  # see handle()

        add_database_option(parser, "acts on")
        parser.add_argument(
            "action",
            choices=["signal", "retry", "cancel"],
            help="signal a wait step, retry the failed steps, or cancel the workflow.",
        )
        parser.add_argument("run_id", help="The workflow's id (a UUID).")
        parser.add_argument("name", nargs="?", help="signal: the signal's name.")
        parser.add_argument("--payload", default="null", help="The payload, as JSON.")
        parser.add_argument(
            "--by", default=None, help="Who sends it (default: user@host of this shell)."
        )

    def handle(
        self,
        *,
        action: str,
        run_id: str,
        name: str | None,
        payload: str,
        by: str | None,
        **options: Any,
    ) -> None:
        from django_gator.management.arguments import chosen_database
        from django_gator.models import WorkflowRun

        try:
            workflow_id = uuid.UUID(run_id)
        except ValueError:
            raise CommandError(f"RUN_ID must be a workflow's id (a UUID), got {run_id!r}") from None
        try:
            value = json.loads(payload)
            check_json(value, "payload")
        except (ValueError, TypeError) as exc:
            raise CommandError(f"--payload must be JSON: {exc} (got {payload!r})") from None
        alias = chosen_database(options)
        run = WorkflowRun.objects.using(alias).filter(pk=workflow_id).first()
        if run is None:
            raise CommandError(f"there is no workflow {workflow_id}")
        sender = by if by is not None else f"{getpass.getuser()}@{socket.gethostname()}"
        if action == "retry":
            count = run.retry(by=sender)
            self.stdout.write(f"Workflow {workflow_id}: {count} failed step job(s) due again.")
            return
        if action == "cancel":
            count = run.cancel(by=sender)
            self.stdout.write(f"Workflow {workflow_id}: {count} job(s) and step(s) cancelled.")
            return
        if name is None:
            raise CommandError("signal needs a NAME: gator_workflow signal RUN_ID NAME")
        try:
            delivered = run.signal(name, value, by=sender)
        except WorkflowError as exc:
            raise CommandError(str(exc)) from None
        if delivered:
            self.stdout.write(f"Signal {name!r} delivered to workflow {workflow_id}.")
        else:
            self.stdout.write(
                f"Signal {name!r} was delivered to workflow {workflow_id} already; this one "
                "changes nothing."
            )
