"""How the admin pages show values: times to the second, JSON payloads, read-only fields."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString


def pretty(value: Any) -> SafeString:
    """``value`` as indented JSON in a ``<pre>`` (escaped)."""
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    return format_html('<pre class="gator-json">{}</pre>', text)


def when(value: datetime | None) -> SafeString | None:
    """A time to the second in the current time zone (the admin's), with its full ISO 8601
    form as the tooltip; None (the admin's "-") when there is none."""
    if value is None:
        return None
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    # The date and the time may go on two lines (the job list is narrow), each unbroken.
    return format_html(
        '<time datetime="{}" title="{}"><span class="nowrap">{}</span> '
        '<span class="nowrap">{}</span></time>',
        value.isoformat(),
        local.isoformat(),
        local.strftime("%Y-%m-%d"),
        local.strftime("%H:%M:%S"),
    )


def time_field(field: str, description: str) -> Callable[[Any, Any], SafeString | None]:
    """A read-only admin field showing the model's datetime ``field`` to the second."""

    @admin.display(description=description, ordering=field)
    def show(self: Any, obj: Any) -> SafeString | None:
        return when(getattr(obj, field))

    return show


def running_for(job: Any) -> float | None:
    """Seconds a running job has run since its claim (``locked_at``), by this server's
    clock; None for a job that is not running."""
    if job.state != "running" or job.locked_at is None:
        return None
    return max(0.0, (timezone.now() - job.locked_at).total_seconds())
