"""The job classes of the benchmark's history, registered under the names its rows carry,
so that the admin's job filter lists them as it would in a project."""

from __future__ import annotations

from typing import Any

from django_gator import Queueable

#: The history's eight common job names, and a rare one (1 job in 100,000).
NAMES = (
    "SendEmail",
    "ResizeImage",
    "SyncAccount",
    "ChargeCard",
    "IndexDocument",
    "Notify",
    "ExportCsv",
    "Webhook",
)
RARE = "YearlyReport"


def _handle(self: Queueable, *args: Any) -> None:
    """The benchmark never runs these."""


JOBS = [type(name, (Queueable,), {"name": f"app.jobs.{name}", "handle": _handle}) for name in NAMES]
