"""Cron schedules: declaring them on job classes and in ``GATOR_SCHEDULES``, and validating
them against the job registry.

The cron maths (occurrences, daylight-saving changes) is in :mod:`django_gator.cron`. The
database makes each (schedule, occurrence) run once: see django_gator.worker.scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_gator import conf, validation

# The cron maths lived here before django_gator.cron: next_occurrence and occurrences stay
# importable from this module (the worker's scheduler uses them).
from django_gator.cron import next_occurrence as next_occurrence
from django_gator.cron import occurrences as occurrences
from django_gator.cron import validate_cron, validate_timezone
from django_gator.payload import encode_payload
from django_gator.registry import get_job_class, registered_jobs

#: Misfire policies: what a worker does with occurrences missed while no worker ran.
MISFIRE_SKIP = "skip"  # forget them; only occurrences within the grace period run
MISFIRE_ONCE = "once"  # run the latest missed occurrence once
MISFIRE_CATCH_UP = "catch_up"  # run every missed occurrence, up to the catch-up limit
MISFIRE_POLICIES = (MISFIRE_SKIP, MISFIRE_ONCE, MISFIRE_CATCH_UP)

SCHEDULE_NAME_MAX_LENGTH = 200


class ScheduleError(ValueError):
    """A schedule definition with a bad field; the message names the schedule and field."""

    def __init__(self, schedule: str, field_name: str, message: str) -> None:
        self.schedule = schedule
        self.field = field_name
        super().__init__(f"schedule {schedule!r}, field {field_name!r}: {message}")


@dataclass(frozen=True)
class Cron:
    """A schedule for a job class: ``schedule = Cron("0 3 * * *", timezone="Europe/Berlin")``
    (a plain string means ``Cron(string)``).

    ``args``/``kwargs``: the arguments of every run. ``queue``/``priority``: None for the
    class's. ``misfire``: ``"skip"``, ``"once"`` (default) or ``"catch_up"``
    (see docs/guides/cron.md).
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
    check("args", lambda _: encode_payload(args, kwargs), None)
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
