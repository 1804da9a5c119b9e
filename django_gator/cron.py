"""Cron maths: validating an expression and a time zone, and working out occurrences.

Pure functions of their arguments (croniter and zoneinfo; no settings, no models, no job
registry), so the models, the scheduler and the admin can all use them. Occurrences are
computed in the schedule's wall-clock time with croniter, then turned into UTC instants:

- a wall-clock time that happens twice (the autumn change) runs once, at its first
  occurrence (the earlier UTC instant);
- a wall-clock time that does not exist (the spring change) runs at the instant the clock
  jumps (02:30 on the night Europe/Berlin goes from 02:00 to 03:00 runs at 03:00 CEST);
  several skipped occurrences fold into that one instant.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, tzinfo
from typing import NamedTuple

from croniter import CroniterBadDateError, croniter

from django_gator import wording

CRON_MAX_LENGTH = 200


def validate_cron(expression: object) -> str:
    """A standard 5-field cron expression or a croniter alias (``@hourly``, ``@daily``...)."""
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError(f"a cron expression must be a non-empty str, got {expression!r}")
    expression = " ".join(expression.split())
    if len(expression) > CRON_MAX_LENGTH:
        raise ValueError(f"cron expression is longer than {CRON_MAX_LENGTH} characters")
    fields = expression.split(" ")
    if not expression.startswith("@") and len(fields) != 5:
        raise ValueError(
            f"{expression!r} has {wording.count(len(fields), 'field')}; use 5: minute hour "
            "day-of-month month day-of-week (e.g. '*/5 * * * *')"
        )
    if not expression.startswith("@"):
        for field, text in zip(FIELDS, fields, strict=True):
            _check_field(expression, field, text)
    if not croniter.is_valid(expression):
        raise ValueError(f"{expression!r} is not a valid cron expression")
    try:
        croniter(expression, datetime(2000, 1, 1)).get_next(datetime)
    except CroniterBadDateError:
        raise ValueError(
            f"{expression!r} never fires: no month it names has the day of the month it names "
            "(February has at most 29 days; April, June, September and November 30)"
        ) from None
    return expression


class Field(NamedTuple):
    """One of the five fields of a cron expression: its name and its values' range."""

    name: str
    low: int
    high: int


FIELDS = (
    Field("minute", 0, 59),
    Field("hour", 0, 23),
    Field("day-of-month", 1, 31),
    Field("month", 1, 12),
    Field("day-of-week", 0, 7),
)

#: One item of a field with a step: ``*/15``, ``10-40/5``, ``5/20``.
_STEPPED = re.compile(r"^(?:(?P<all>\*)|(?P<low>\d+)(?:-(?P<high>\d+))?)/(?P<step>\d+)$")


def _check_field(expression: str, field: Field, text: str) -> None:
    """Refuse a field croniter refuses, naming it, and a step that leaves only the first
    value of its range (``*/61`` in the minutes runs once an hour, not every 61 minutes)."""
    alone = ["*"] * len(FIELDS)
    alone[FIELDS.index(field)] = text
    if not croniter.is_valid(" ".join(alone)):
        raise ValueError(
            f"{expression!r} is not a valid cron expression: its {field.name} field "
            f"{text!r} is not valid (values {field.low}-{field.high}, lists a,b, ranges a-b, "
            "steps */n)"
        )
    for item in text.split(","):
        stepped = _STEPPED.match(item)
        if stepped is None:
            continue
        low = field.low if stepped["all"] else int(stepped["low"])
        high = field.high if stepped["all"] or not stepped["high"] else int(stepped["high"])
        step = int(stepped["step"])
        if step > high - low:
            raise ValueError(
                f"{expression!r} does not mean what it says: in its {field.name} field, "
                f"{item!r} steps by {step} over {low}-{high}, so it matches {low} alone; "
                f"write {str(low)!r} if that is meant, or a step of at most {high - low}"
            )


def validate_timezone(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a time zone must be an IANA name such as 'Europe/Berlin', got {name!r}")
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {name!r}; use an IANA name such as 'Europe/Berlin'"
        ) from None
    return name


def to_utc(wall: datetime, zone: tzinfo) -> datetime:
    """The UTC instant of naive wall-clock time ``wall`` in ``zone`` (see the module doc)."""
    first = wall.replace(tzinfo=zone, fold=0)
    second = wall.replace(tzinfo=zone, fold=1)
    first_utc, second_utc = first.astimezone(UTC), second.astimezone(UTC)
    if first_utc.astimezone(zone).replace(tzinfo=None) == wall:
        # The time exists: once (fold=0 is the earlier of two, when it happens twice).
        return min(first_utc, second_utc)
    # It does not exist: the clock jumped over it. The jump lies between the two readings;
    # find the first instant with the new offset.
    low, high = sorted((first_utc, second_utc))
    after = high.astimezone(zone).utcoffset()
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(zone).utcoffset() == after:
            high = middle
        else:
            low = middle
    return high.replace(microsecond=0)


def occurrences(
    expression: str, zone_name: str, after: datetime, until: datetime
) -> Iterator[datetime]:
    """UTC instants of ``expression`` in ``zone_name`` in (``after``, ``until``], in order."""
    zone = zoneinfo.ZoneInfo(zone_name)
    start = after.astimezone(zone).replace(tzinfo=None)
    # Step back a little so a wall time that maps forward (a skipped hour) is not missed.
    iterator = croniter(expression, start - timedelta(hours=3))
    last: datetime | None = None
    while True:
        wall = iterator.get_next(datetime)
        instant = to_utc(wall, zone)
        if instant > until:
            return
        if instant <= after or instant == last:
            continue
        last = instant
        yield instant


def next_occurrence(expression: str, zone_name: str, after: datetime) -> datetime:
    """The first UTC instant of ``expression`` after ``after``."""
    horizon = after + timedelta(days=366 * 5)
    for instant in occurrences(expression, zone_name, after, horizon):
        return instant
    raise ValueError(f"{expression!r} has no occurrence in the next five years")
