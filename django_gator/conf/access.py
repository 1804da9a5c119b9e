"""The core of :mod:`django_gator.conf`: the table by name, the raw and the checked read of
a setting, and the error a bad value raises. The package re-exports every name here."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
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
    ``override_settings`` swaps in): through the lazy wrapper, a setting left unset
    costs a raised AttributeError, about 2 microseconds, and dispatch reads four."""
    wrapped = settings._wrapped  # type: ignore[misc]  # LazyObject's own attribute
    if wrapped is empty:
        return getattr(settings, name, BY_NAME[name].default)
    return getattr(wrapped, name, BY_NAME[name].default)


#: Immutable values that passed their setting's check, by name: the same object passes again.
_ALLOWED: dict[str, Any] = {}
_IMMUTABLE = (bool, int, float, str, type(None))


def value(name: str) -> Any:
    """The value of a declared setting; :class:`InvalidSetting` when its declaration does
    not allow it, with the message of the system check."""
    raw = get(name)
    if name in _ALLOWED and _ALLOWED[name] is raw:
        return raw
    problem = BY_NAME[name].problem(raw)
    if problem is not None:
        raise InvalidSetting(problem)
    if type(raw) in _IMMUTABLE:
        _ALLOWED[name] = raw
    return raw
