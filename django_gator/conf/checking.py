"""What is wrong with the ``GATOR_*`` settings: the problems the system check reports
(``django_gator.E003``, ``W004``), computed from the declared table."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from django.conf import settings

from django_gator.conf import BY_NAME, SETTINGS, get, range_error


@dataclass(frozen=True)
class Problem:
    """A bad setting: the message names it and its value, the hint what it allows."""

    message: str
    hint: str


def problems(*, deep: bool = True) -> list[Problem]:
    """What is wrong with the settings, one problem per bad setting (E003 of the system
    checks), plus a heartbeat timeout not longer than the interval. Settings validated by
    another check (``checked_by``) are left to it. ``deep``: import the dotted paths."""
    found = []
    for setting in SETTINGS:
        if setting.checked_by is None:
            problem = setting.problem(get(setting.name), deep=deep)
            if problem is not None:
                hint = (
                    f"Allowed: {setting.rule.allowed()}; the default is {setting.shown_default()}."
                )
                found.append(Problem(problem, hint.replace("`", "")))
    interval, timeout = get("GATOR_HEARTBEAT_INTERVAL"), get("GATOR_HEARTBEAT_TIMEOUT")
    if (
        range_error("GATOR_HEARTBEAT_INTERVAL", interval) is None
        and range_error("GATOR_HEARTBEAT_TIMEOUT", timeout) is None
        and timeout <= interval
    ):
        found.append(
            Problem(
                f"GATOR_HEARTBEAT_TIMEOUT ({timeout}) must be longer than "
                f"GATOR_HEARTBEAT_INTERVAL ({interval})",
                "Use a timeout of several intervals, or live workers will be rescued.",
            )
        )
    return found


def unknown_names() -> list[tuple[str, str | None]]:
    """``GATOR_*`` names in the settings that are not declared (a typo: the setting meant
    keeps its default), each with the closest declared name or None."""
    found = []
    for name in sorted(dir(settings)):
        if name.startswith("GATOR_") and name not in BY_NAME:
            close = difflib.get_close_matches(name, list(BY_NAME), n=1, cutoff=0.8)
            found.append((name, close[0] if close else None))
    return found
