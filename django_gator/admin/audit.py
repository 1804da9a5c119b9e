"""The audit trail on a job's admin page: who did what when, and an argument edit's values
before and after it (redacted as the payload is)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from django_gator import redaction
from django_gator.admin.arguments import EDIT_ACTION
from django_gator.admin.display import pretty
from django_gator.models import Job


class AuditDisplay:
    """The job page's "audit trail" field (a mixin of the Job admin)."""

    @admin.display(description="audit trail")
    def audit_html(self, job: Job) -> SafeString:
        """Who did what when; an argument edit also shows the values before and after it,
        redacted as the payload is."""
        entries = [e for e in job.audit or [] if isinstance(e, dict)]
        if not entries:
            return format_html("<p>{}</p>", "No operator action yet.")
        shown = []
        for e in entries:
            line = format_html(
                "<p>{} &middot; {} by <b>{}</b>{}</p>",
                e.get("at", ""),
                e.get("action", ""),
                e.get("by", "?"),
                f" (onto queue {e['queue']})" if e.get("queue") else "",
            )
            if e.get("action") == EDIT_ACTION and isinstance(e.get("before"), dict):
                line += self._edit_values(job, e["before"], e.get("after"))
            shown.append((line,))
        return format_html_join("\n", "{}", shown)

    @staticmethod
    def _edit_values(job: Job, before: dict[str, Any], after: Any) -> SafeString:
        after = after if isinstance(after, dict) else {}
        old = redaction.redact_payload(job.name, before.get("args"), before.get("kwargs"))
        new = redaction.redact_payload(job.name, after.get("args"), after.get("kwargs"))
        return format_html(
            '<table class="gator-edit"><thead><tr><th></th><th>{}</th><th>{}</th></tr></thead>'
            "<tbody><tr><th>args</th><td>{}</td><td>{}</td></tr>"
            "<tr><th>kwargs</th><td>{}</td><td>{}</td></tr></tbody></table>",
            "before",
            "after",
            pretty(old[0]),
            pretty(new[0]),
            pretty(old[1]),
            pretty(new[1]),
        )
