"""A running job's stored progress as the figures people read (done, total, percent, rate,
time left), shared by the admin and ``gator_status``; nothing here needs the admin app, so
a project without ``django.contrib.admin`` can run ``gator_status``."""

from __future__ import annotations

from typing import Any


def progress_parts(progress: Any) -> dict[str, Any] | None:
    """A stored progress as the figures shown: done, total, percent, note, rate, eta
    (seconds), at; None if there is none (or it is not a progress object)."""
    if not isinstance(progress, dict) or not isinstance(progress.get("done"), (int, float)):
        return None
    done, total = progress["done"], progress.get("total")
    rate = progress.get("rate")
    parts: dict[str, Any] = {
        "done": done,
        "total": total if isinstance(total, (int, float)) else None,
        "note": str(progress.get("note") or ""),
        "rate": rate if isinstance(rate, (int, float)) and rate > 0 else None,
        "at": str(progress.get("at") or ""),
        "percent": None,
        "eta": None,
    }
    if parts["total"]:
        parts["percent"] = max(0.0, min(100.0, 100.0 * done / parts["total"]))
        if parts["rate"]:
            parts["eta"] = max(0.0, (parts["total"] - done) / parts["rate"])
    return parts


def number_text(value: float) -> str:
    """A count or a rate as shown: whole numbers without decimals, thousands separated."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def progress_text(parts: dict[str, Any]) -> str:
    """``done / total (pct %)``, the way gator_status prints it too."""
    text = number_text(parts["done"])
    if parts["total"] is not None:
        text += f" / {number_text(parts['total'])}"
    if parts["percent"] is not None:
        text += f" ({parts['percent']:.0f} %)"
    return text
