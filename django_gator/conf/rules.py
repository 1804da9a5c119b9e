"""The kinds of value a ``GATOR_*`` setting may take, and :class:`Setting`, one declared
setting. Each kind says why a value is not allowed (the words of the system check and of
the accessors' errors) and, for the settings reference page, what it allows."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from django.utils.module_loading import import_string

from django_gator.limits import queue_options_problem


class Rule(Protocol):
    def problem(self, value: Any, *, deep: bool = False) -> str | None:
        """Why ``value`` is not allowed (``"must be at least 1, got 0"``), or None.
        ``deep``: also import what the value names (the system check does; the accessors,
        called on hot paths, do not)."""

    def allowed(self) -> str:
        """The allowed values in a few words, for the settings reference page."""


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


@dataclass(frozen=True)
class Number:
    """A number from ``low`` to ``high`` (None: no upper bound); ``whole``: an int only;
    ``none``: None is allowed too, and means this."""

    low: float
    high: float | None = None
    whole: bool = False
    none: str | None = None

    def bounds(self) -> str:
        low = _number_text(self.low)
        if self.high is None:
            return f"at least {low}"
        return f"from {low} to {_number_text(self.high)}"

    def problem(self, value: Any, *, deep: bool = False, given: str | None = None) -> str | None:
        shown = repr(value) if given is None else given
        if value is None and self.none is not None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            what = "a whole number" if self.whole else "a number"
            return f"must be {'None or ' if self.none else ''}{what}, got {shown}"
        if self.whole and not isinstance(value, int):
            return f"must be a whole number, got {shown}"
        high = self.high
        if not (math.isfinite(value) and self.low <= value and (high is None or value <= high)):
            return f"must be {self.bounds()}, got {shown}"
        return None

    def allowed(self) -> str:
        what = "whole number" if self.whole else "number"
        text = f"{what}, {self.bounds()}"
        return f"`None` ({self.none}) or {text}" if self.none else text


@dataclass(frozen=True)
class Flag:
    def problem(self, value: Any, *, deep: bool = False) -> str | None:
        return None if isinstance(value, bool) else f"must be True or False, got {value!r}"

    def allowed(self) -> str:
        return "`True` or `False`"


@dataclass(frozen=True)
class Text:
    """A non-empty string: ``what`` it names."""

    what: str
    #: None is allowed too, and means this.
    none: str | None = None

    def problem(self, value: Any, *, deep: bool = False) -> str | None:
        if (isinstance(value, str) and value) or (value is None and self.none is not None):
            return None
        alternative = "None or " if self.none is not None else ""
        return f"must be {alternative}{self.what} (a non-empty string), got {value!r}"

    def allowed(self) -> str:
        return self.what if self.none is None else f"`None` ({self.none}) or {self.what}"


@dataclass(frozen=True)
class LogLevel:
    """None (``none`` says what it means), or a ``logging`` level: a name, or a number."""

    none: str

    def problem(self, value: Any, *, deep: bool = False) -> str | None:
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return None
        if isinstance(value, str) and isinstance(logging.getLevelName(value.upper()), int):
            return None
        return f"must be None or a logging level name (DEBUG, INFO, ...) or number, got {value!r}"

    def allowed(self) -> str:
        return f"`None` ({self.none}) or a `logging` level name or number"


@dataclass(frozen=True)
class Choice:
    """One of ``values`` (strings), or None, which means ``none``."""

    values: tuple[str, ...]
    none: str

    def problem(self, value: Any, *, deep: bool = False) -> str | None:
        if value is None or value in self.values:
            return None
        listed = ", ".join(repr(v) for v in self.values)
        return f"must be None or one of {listed}, got {value!r}"

    def allowed(self) -> str:
        listed = " or ".join(f'`"{v}"`' for v in self.values)
        return f"`None` ({self.none}), {listed}"


@dataclass(frozen=True)
class Names:
    """A list of non-empty strings, each ``what`` (``"key name"``). ``sets``: a set is
    accepted too (order does not matter). ``importable``: each names a callable that the
    deep check imports."""

    what: str
    sets: bool = False
    importable: bool = False
    #: None is allowed too, and means this.
    none: str | None = None
    #: Each is a key of ``DATABASES`` (the deep check looks).
    aliases: bool = False

    def problem(self, value: Any, *, deep: bool = False) -> str | None:
        if value is None and self.none is not None:
            return None
        if not isinstance(value, list | tuple | set | frozenset) or (
            not self.sets and isinstance(value, set | frozenset)
        ):
            return f"must be a list of {self.what}s, got {value!r}"
        for item in value:
            if not isinstance(item, str) or not item.strip():
                return f"must be a list of {self.what}s; {item!r} is not one"
        if deep and self.importable:
            for item in value:
                problem = _import_problem(item)
                if problem is not None:
                    return problem
        if deep and self.aliases:
            from django.conf import settings

            for item in value:
                if item not in settings.DATABASES:
                    return f"names {item!r}, which is not a key of DATABASES"
        return None

    def allowed(self) -> str:
        listed = f"list of {self.what}s"
        return listed if self.none is None else f"`None` ({self.none}) or {listed}"


@dataclass(frozen=True)
class Delays:
    """A list of seconds, each from ``low`` to ``high``."""

    low: float
    high: float

    def problem(self, value: Any, *, deep: bool = False) -> str | None:
        if isinstance(value, list | tuple) and all(
            not isinstance(v, bool)
            and isinstance(v, int | float)
            and math.isfinite(v)
            and self.low <= v <= self.high
            for v in value
        ):
            return None
        return f"must be a list of seconds {self.bounds()}, got {value!r}"

    def bounds(self) -> str:
        return f"from {_number_text(self.low)} to {_number_text(self.high)}"

    def allowed(self) -> str:
        return f"list of seconds, each {self.bounds()}"


def split_host_port(value: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (``"[::1]:0"`` for IPv6) as (host, port); ValueError says what is
    wrong."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError("is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or (":" in host and not value.startswith("[")):
        raise ValueError("is not HOST:PORT (write an IPv6 address as [ADDRESS]:PORT)")
    if not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError("has no port from 0 to 65535 after the colon")
    return host, int(port_text)


@dataclass(frozen=True)
class HostPort:
    """None (off), or ``"HOST:PORT"``: where a socket is bound (port 0: any free port)."""

    what: str

    def problem(self, value: Any, *, deep: bool = False) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str):
            return f'must be None or a "HOST:PORT" string, got {value!r}'
        try:
            split_host_port(value)
        except ValueError as exc:
            return f'must be None or a "HOST:PORT" string; {value!r} {exc}'
        return None

    def allowed(self) -> str:
        return f'`None` (off) or `"HOST:PORT"`: {self.what}'


@dataclass(frozen=True)
class Table:
    """A dict whose entries another check validates (``checked_by``)."""

    what: str

    def problem(self, value: Any, *, deep: bool = False) -> str | None:
        return None if isinstance(value, Mapping) else f"must be a dict, got {value!r}"

    def allowed(self) -> str:
        return self.what


@dataclass(frozen=True)
class QueueTable:
    """``GATOR_QUEUES``: ``{queue name: {"concurrency": N, "rate_limit": "N/s"}}``. Unknown
    options are left to the warning django_gator.W005, queue names that are not valid to
    the check itself (validation sits above conf)."""

    def problem(self, value: Any, *, deep: bool = False) -> str | None:
        if not isinstance(value, Mapping):
            return f"must be a dict of queue names to options, got {value!r}"
        for queue, options in value.items():
            if not isinstance(queue, str) or not queue:
                return f"must be a dict with queue names as keys, got {queue!r}"
            problem = queue_options_problem(queue, options)
            if problem is not None:
                return f"must be a dict of valid queue limits: {problem}"
        return None

    def allowed(self) -> str:
        return 'dict `{queue: {"concurrency": N, "rate_limit": "N/s"}}`'


@dataclass(frozen=True)
class QueueRoutes:
    """``GATOR_QUEUE_DATABASES``: ``{queue name: database alias}``, both non-empty strings
    (whether each alias is a key of ``DATABASES`` is the system check E008's)."""

    def problem(self, value: Any, *, deep: bool = False) -> str | None:
        if not isinstance(value, Mapping):
            return f"must be a dict of queue names to database aliases, got {value!r}"
        for queue, alias in value.items():
            if not isinstance(queue, str) or not queue:
                return f"must be a dict with queue names as keys, got {queue!r}"
            if not isinstance(alias, str) or not alias:
                return f"must be a dict of queue names to database aliases, got {value!r}"
        return None

    def allowed(self) -> str:
        return "dict `{queue: alias}` (each alias a key of `DATABASES`)"


@dataclass(frozen=True)
class CallablePath:
    """None, a callable, or the dotted path of one (imported by the deep check)."""

    def problem(self, value: Any, *, deep: bool = False) -> str | None:
        if value is None or callable(value):
            return None
        if not isinstance(value, str) or not value:
            return f"must be None, a callable or its dotted path, got {value!r}"
        return _import_problem(value) if deep else None

    def allowed(self) -> str:
        return "`None` or the dotted path of a callable"


def _import_problem(path: str) -> str | None:
    try:
        target = import_string(path)
    except ImportError as exc:
        return f"names {path!r}, which cannot be imported: {exc}"
    if not callable(target):
        return f"names {path!r}, which is not callable"
    return None


@dataclass(frozen=True)
class Setting:
    """One ``GATOR_*`` setting. ``shown``: the default as the settings reference page writes
    it, when it is too long for the table; ``checked_by``: the system check that validates
    the value when it is not E003 (which still refuses a value of the wrong shape in the
    accessor)."""

    name: str
    default: Any
    rule: Rule
    meaning: str
    shown: str | None = None
    checked_by: str | None = None

    def problem(self, value: Any, *, deep: bool = False) -> str | None:
        """``"GATOR_X must be ..., got ..."``, or None when ``value`` is allowed."""
        problem = self.rule.problem(value, deep=deep)
        return None if problem is None else f"{self.name} {problem}"

    def shown_default(self) -> str:
        if self.shown is not None:
            return self.shown
        if isinstance(self.default, str):
            return f'"{self.default}"'
        return repr(self.default)
