"""Cron schedules: declaring them, validating them, and working out their occurrences.

Occurrences are computed in the schedule's wall-clock time with croniter, then turned into
UTC instants:

- a wall-clock time that happens twice (the autumn change) runs once, at its first
  occurrence (the earlier UTC instant);
- a wall-clock time that does not exist (the spring change) runs at the instant the clock
  jumps (02:30 on the night Europe/Berlin goes from 02:00 to 03:00 runs at 03:00 CEST);
  several skipped occurrences fold into that one instant.

The database makes each (schedule, occurrence) run once: see django_gator.worker.scheduler.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from croniter import croniter
from django.core.exceptions import ImproperlyConfigured

from django_gator import validation, wording

#: Misfire policies: what a worker does with occurrences missed while no worker ran.
MISFIRE_SKIP = "skip"  # forget them; only occurrences within the grace period run
MISFIRE_ONCE = "once"  # run the latest missed occurrence once
MISFIRE_CATCH_UP = "catch_up"  # run every missed occurrence, up to the catch-up limit
MISFIRE_POLICIES = (MISFIRE_SKIP, MISFIRE_ONCE, MISFIRE_CATCH_UP)

SCHEDULE_NAME_MAX_LENGTH = 200
CRON_MAX_LENGTH = 200


class ScheduleError(ValueError):
    """A schedule definition with a bad field; the message names the schedule and field."""

    def __init__(self, schedule: str, field_name: str, message: str) -> None:
        self.schedule = schedule
        self.field = field_name
        super().__init__(f"schedule {schedule!r}, field {field_name!r}: {message}")


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
    if not croniter.is_valid(expression):
        raise ValueError(f"{expression!r} is not a valid cron expression")
    return expression


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


@dataclass(frozen=True)
class Cron:
    """A schedule for a job class: ``schedule = Cron("0 3 * * *", timezone="Europe/Berlin")``
    (a plain string means ``Cron(string)``).

    ``args``/``kwargs``: the arguments of every run. ``queue``/``priority``: None for the
    class's. ``misfire``: ``"skip"``, ``"once"`` (default) or ``"catch_up"`` (see the README).
    ``catch_up_limit``: most occurrences run by ``catch_up`` after a downtime.
    ``overlap``: False skips an occurrence while the previous run is still waiting, retrying or
    running. ``name``: the schedule's name (default: the job name, plus ``#2`` ... when a class
    has several).
    """

    cron: str
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    queue: str | None = None
    priority: int | None = None
    timezone: str = "UTC"
    misfire: str = MISFIRE_ONCE
    catch_up_limit: int = 100
    overlap: bool = True
    name: str | None = None


@dataclass(frozen=True)
class ScheduleSpec:
    """A validated schedule, as stored in the ``Schedule`` table."""

    name: str
    job_name: str
    cron: str
    args: list[Any]
    kwargs: dict[str, Any]
    queue: str | None
    priority: int | None
    timezone: str
    misfire: str
    catch_up_limit: int
    overlap: bool
    source: str  # "code" or "settings"


def build_spec(name: str, job_name: str, cron: Cron, source: str) -> ScheduleSpec:
    """Validate ``cron`` for the job ``job_name``; ScheduleError names the bad field."""
    from django_gator.queueable import get_job_class

    if not isinstance(name, str) or not name or len(name) > SCHEDULE_NAME_MAX_LENGTH:
        raise ScheduleError(str(name), "name", f"use 1 to {SCHEDULE_NAME_MAX_LENGTH} characters")

    def check(field_name: str, func: Any, value: Any) -> Any:
        try:
            return func(value)
        except (TypeError, ValueError) as exc:
            raise ScheduleError(name, field_name, str(exc)) from None

    expression = check("cron", validate_cron, cron.cron)
    zone = check("timezone", validate_timezone, cron.timezone)
    try:
        job_class = get_job_class(job_name)
    except Exception as exc:
        raise ScheduleError(name, "job", str(exc)) from None
    args = list(check("args", lambda v: _sequence(v, "args"), cron.args))
    kwargs = dict(check("kwargs", lambda v: _mapping(v, "kwargs"), cron.kwargs))
    check("args", lambda _: job_class.check_arguments(args, kwargs), None)
    check("args", lambda _: validation.encode_payload(args, kwargs), None)
    queue = None if cron.queue is None else check("queue", validation.validate_queue, cron.queue)
    priority = (
        None
        if cron.priority is None
        else check("priority", validation.validate_priority, cron.priority)
    )
    if cron.misfire not in MISFIRE_POLICIES:
        raise ScheduleError(
            name, "misfire", f"{cron.misfire!r} is not one of {', '.join(MISFIRE_POLICIES)}"
        )
    if isinstance(cron.catch_up_limit, bool) or not isinstance(cron.catch_up_limit, int):
        raise ScheduleError(name, "catch_up_limit", f"must be an int, got {cron.catch_up_limit!r}")
    if cron.catch_up_limit < 1:
        raise ScheduleError(
            name, "catch_up_limit", f"must be at least 1, got {cron.catch_up_limit}"
        )
    if not isinstance(cron.overlap, bool):
        raise ScheduleError(name, "overlap", f"must be True or False, got {cron.overlap!r}")
    return ScheduleSpec(
        name=name,
        job_name=job_class.name,
        cron=expression,
        args=args,
        kwargs=kwargs,
        queue=queue,
        priority=priority,
        timezone=zone,
        misfire=cron.misfire,
        catch_up_limit=cron.catch_up_limit,
        overlap=cron.overlap,
        source=source,
    )


def _sequence(value: object, what: str) -> Sequence[Any]:
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise TypeError(f"{what} must be a list, got {value!r}")
    return value


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} must be a dict, got {value!r}")
    return value


_SETTINGS_KEYS = {
    "job",
    "cron",
    "args",
    "kwargs",
    "queue",
    "priority",
    "timezone",
    "misfire",
    "catch_up_limit",
    "overlap",
}


def declared_schedules() -> list[ScheduleSpec]:
    """Every schedule declared on job classes and in ``GATOR_SCHEDULES``, validated.

    Raises ImproperlyConfigured naming the schedule and the field of every bad one (one per
    line); :func:`schedule_errors` lists them.
    """
    specs, errors = _declared()
    if errors:
        raise ImproperlyConfigured("\n".join(errors))
    return specs


def schedule_errors() -> list[str]:
    """One message per bad declared schedule (each names the schedule and the field), so a
    system check can report all of them at once."""
    return _declared()[1]


def _declared() -> tuple[list[ScheduleSpec], list[str]]:
    specs: list[ScheduleSpec] = []
    errors: list[str] = []
    _code_schedules(specs, errors)
    _settings_schedules(specs, errors)
    return specs, errors


def _code_schedules(specs: list[ScheduleSpec], errors: list[str]) -> None:
    from django_gator.queueable import registered_jobs

    for job_name, job_class in sorted(registered_jobs().items()):
        declared = getattr(job_class, "schedule", None)
        if declared is None:
            continue
        items = declared if isinstance(declared, list | tuple) else [declared]
        for index, item in enumerate(items):
            try:
                cron = Cron(item) if isinstance(item, str) else item
                if not isinstance(cron, Cron):
                    raise ScheduleError(
                        job_name, "schedule", f"must be a cron string or a Cron, got {item!r}"
                    )
                name = cron.name or (job_name if index == 0 else f"{job_name}#{index + 1}")
                specs.append(build_spec(name, job_name, cron, "code"))
            except ScheduleError as exc:
                errors.append(str(exc))


def _settings_schedules(specs: list[ScheduleSpec], errors: list[str]) -> None:
    from django_gator import conf

    declared = conf.get("GATOR_SCHEDULES")
    if not isinstance(declared, Mapping):
        errors.append(f"GATOR_SCHEDULES must be a dict of name -> schedule, got {declared!r}")
        return
    for name, entry in declared.items():
        try:
            specs.append(_settings_schedule(str(name), entry))
        except ScheduleError as exc:
            errors.append(str(exc))


def _settings_schedule(name: str, entry: object) -> ScheduleSpec:
    if not isinstance(entry, Mapping):
        raise ScheduleError(name, "*", f"must be a dict, got {entry!r}")
    unknown = set(entry) - _SETTINGS_KEYS
    if unknown:
        raise ScheduleError(name, sorted(unknown)[0], f"unknown key; use {sorted(_SETTINGS_KEYS)}")
    for required in ("job", "cron"):
        if required not in entry:
            raise ScheduleError(name, required, "is required")
    options = {k: v for k, v in entry.items() if k not in ("job", "cron")}
    cron = Cron(entry["cron"], **options)
    return build_spec(name, entry["job"], cron, "settings")
