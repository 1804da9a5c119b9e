"""The core of :mod:`django_gator.conf`: the table by name, the raw and the checked read of
a setting, and the error a bad value raises. The package re-exports every name here."""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.functional import empty

from django_gator.conf.rules import Number, Setting
from django_gator.conf.table import SETTINGS
from django_gator.exceptions import GatorError


class InvalidSetting(GatorError, ImproperlyConfigured, ValueError):
    """A ``GATOR_*`` setting has a value its declaration does not allow. (A ValueError too,
    so code that guards a conversion of the value with ``except ValueError`` still does.)"""


BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}

#: Each setting's default.
DEFAULTS: dict[str, Any] = {s.name: s.default for s in SETTINGS}

#: Allowed ranges of the numeric settings, ``name: (least, most or None)``. The worker's
#: command-line options that stand in for a setting (``--poll-interval``, ``--concurrency``,
#: ``--shutdown-timeout``) validate with :func:`range_error`, so a value refused in settings
#: is refused on the command line too.
RANGES: dict[str, tuple[float, float | None]] = {
    s.name: (s.rule.low, s.rule.high) for s in SETTINGS if isinstance(s.rule, Number)
}


def _number_rule(name: str) -> Number:
    rule = BY_NAME[name].rule
    if not isinstance(rule, Number):
        raise LookupError(f"{name} is not a numeric setting")
    return rule


def allowed_range(name: str) -> str:
    """``"at least 0.001"`` or ``"from 1 to 1000"``: the range of a numeric setting."""
    return _number_rule(name).bounds()


def range_error(name: str, value: object, given: str | None = None) -> str | None:
    """Why ``value`` is not allowed for the numeric setting ``name`` (``"must be at least
    0.001, got 0"``), or None when it is. ``given`` is how the user wrote the value (the
    command-line text); the default is its repr."""
    return _number_rule(name).problem(value, given=given)


def get(name: str) -> Any:
    """The raw value of a declared setting (its default when unset), not validated.

    Read from the settings object behind ``django.conf.settings`` (the one
    ``override_settings`` swaps in) the first time, then kept until Django says a setting
    changed (``setting_changed``: ``override_settings``, pytest-django's ``settings``
    fixture). Through the lazy wrapper a setting left unset costs a raised AttributeError,
    about 2 microseconds, and a dispatch reads eight."""
    found = _RAW.get(name, _MISSING)
    if found is not _MISSING:
        return found
    generation = _generation
    wrapped = settings._wrapped  # type: ignore[misc]  # LazyObject's own attribute
    if wrapped is empty:
        found = getattr(settings, name, BY_NAME[name].default)
    else:
        found = getattr(wrapped, name, BY_NAME[name].default)
    _keep(_RAW, name, found, generation)
    return found


def value(name: str) -> Any:
    """The value of a declared setting; :class:`InvalidSetting` when its declaration does
    not allow it, with the message of the system check (every time it is read: a bad
    value is not kept)."""
    found = _VALID.get(name, _MISSING)
    if found is not _MISSING:
        return found
    generation = _generation
    raw = get(name)
    problem = BY_NAME[name].problem(raw)
    if problem is not None:
        raise InvalidSetting(problem)
    _keep(_VALID, name, raw, generation)
    return raw


# -- what was read, until a setting changes ----------------------------------------------------
#
# Settings do not change while a process runs, but for override_settings (and what is built on
# it), which sends ``setting_changed`` after swapping the settings object in or out. The values
# read are kept by name until then: a dispatch reads eight settings, and reading one through
# the lazy settings object and checking it cost about a microsecond each (two for a list or a
# dict). A value read by another thread while a setting changes is kept only if no change was
# signalled since that read began (the generation), so a stale value cannot outlive the
# change. A value changed in place (a GATOR_QUEUES dict edited at run time) is not seen: Django
# does not support changing settings at run time either.

_MISSING = object()
_RAW: dict[str, Any] = {}
_VALID: dict[str, Any] = {}
_generation = 0
_lock = threading.Lock()


def _keep(kept: dict[str, Any], name: str, found: Any, generation: int) -> None:
    with _lock:
        if generation == _generation:
            kept[name] = found


def forget(**_: Any) -> None:
    """Drop every value kept (a setting changed). Connected to ``setting_changed``."""
    global _generation
    with _lock:
        _generation += 1
        _RAW.clear()
        _VALID.clear()


setting_changed.connect(forget, dispatch_uid="django_gator.conf.forget")
