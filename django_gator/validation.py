"""Validation of everything a caller hands to dispatch: arguments, queues, priorities, times.

Errors name the bad value and where it sits (``args[1]['when']``), so the caller can fix
the call without reading our source.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from django_gator.wording import article

QUEUE_RE = re.compile(r"[A-Za-z0-9_.:\-]+")
# Mirrors of the column sizes in models.py (which cannot be imported before apps are ready).
PRIORITY_MIN = -100
PRIORITY_MAX = 100
QUEUE_MAX_LENGTH = 100
NAME_MAX_LENGTH = 255
UNIQUE_KEY_MAX_LENGTH = 200
#: Deepest nesting of lists and dicts accepted in arguments (``args``/``kwargs`` count as
#: one level). MariaDB's JSON_VALID(), the CHECK on its JSON columns, refuses documents
#: nested 32 levels deep, so 31 is the most every supported database stores.
MAX_DEPTH = 31
#: Largest int accepted, in bits (Python refuses to print ints of over ~4300 digits).
MAX_INT_BITS = 14_000
#: Floats from this size up come back from PostgreSQL's jsonb as ints.
FLOAT_LIMIT = 1e16
_FAST_INT = 2**63
_BAD_CHARS = re.compile("[\x00\ud800-\udfff]")


def short_repr(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_json(value: object, path: str) -> None:
    """Raise TypeError unless ``value`` comes back equal from a trip through JSON and the
    database's JSON column.

    Accepted: dict with str keys, list, str, int, finite float, bool, None (and subclasses of
    str, int and float, which compare equal after the trip). Refused with the path and type
    of the first offender: tuples (they come back as lists), sets, bytes, datetimes, Decimals,
    model instances, NaN and infinities, dicts with non-str keys, strings with NUL or lone
    surrogates (PostgreSQL's jsonb and UTF-8 cannot hold them), floats of 1e16 and more
    (jsonb hands them back as ints), ints of over 14,000 bits and nesting over
    :data:`MAX_DEPTH` levels.
    """
    if _flat_and_plain(value):
        return
    stack: list[tuple[object, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, str):
            _check_str(item, where)
        elif isinstance(item, int | float):
            _check_number(item, where)
        elif depth >= MAX_DEPTH and type(item) in (list, dict):
            raise TypeError(f"{where} is nested deeper than {MAX_DEPTH} levels")
        elif type(item) is list:
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item))
        elif type(item) is dict:
            stack.extend(_dict_items(item, where, depth))
        else:
            hint = " (tuples come back as lists: pass a list)" if isinstance(item, tuple) else ""
            raise TypeError(
                f"{where} is {article(_type_name(item))} ({short_repr(item)}), which does not "
                f"round-trip through JSON{hint}; pass JSON-compatible values (str, int, float, "
                "bool, None, list, dict with str keys), e.g. an id instead of a model instance"
            )


def _flat_and_plain(value: object) -> bool:
    """The fast path: a flat list or dict (str keys) of plain atoms, most job arguments."""
    if isinstance(value, list) and type(value) is list:
        return all(_plain(v) for v in value)
    return (
        isinstance(value, dict)
        and type(value) is dict
        and all(type(k) is str and _clean_str(k) and _plain(v) for k, v in value.items())
    )


def _check_number(item: float, where: str) -> None:
    """Refuse an int too long, or a float that is not finite or that jsonb turns into an
    int."""
    if isinstance(item, int):
        if item.bit_length() > MAX_INT_BITS:
            raise TypeError(
                f"{where} is an int of {item.bit_length()} bits, over the {MAX_INT_BITS} "
                "that JSON is used with here; pass it as a str"
            )
        return
    if not math.isfinite(item):
        raise TypeError(
            f"{where} is {item!r}, which JSON cannot represent; pass None or a finite number"
        )
    if abs(item) >= FLOAT_LIMIT:
        raise TypeError(
            f"{where} is the float {item!r}; PostgreSQL's jsonb hands floats of 1e16 "
            "and more back as ints: pass it as a str or an int"
        )


def _dict_items(item: dict[Any, Any], where: str, depth: int) -> list[tuple[object, str, int]]:
    """A dict's values to check next, with their paths; TypeError at a key that is not a
    str or holds a refused character."""
    items: list[tuple[object, str, int]] = []
    for key, v in item.items():
        if not isinstance(key, str):
            raise TypeError(
                f"{where} has the key {short_repr(key)} of type "
                f"{_type_name(key)}; JSON object keys must be str"
            )
        _check_str(key, f"{where} key {short_repr(key)}")
        items.append((v, f"{where}[{key!r}]", depth + 1))
    return items


def _plain(v: object) -> bool:
    kind = type(v)
    if kind is str:
        return _clean_str(v)  # type: ignore[arg-type]
    if kind is int:
        return -_FAST_INT <= v < _FAST_INT  # type: ignore[operator]
    return kind is bool or v is None


def _clean_str(text: str) -> bool:
    return _BAD_CHARS.search(text) is None


def _check_str(text: str, where: str) -> None:
    bad = _BAD_CHARS.search(text)
    if bad is not None:
        raise TypeError(
            f"{where} contains the character {bad.group()!r} at index {bad.start()}, which "
            "cannot be stored in JSON here (NUL and lone surrogates are refused)"
        )


def _type_name(value: object) -> str:
    cls = type(value)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


#: The encoder of :func:`dumps` (compact, non-ASCII kept, NaN refused).
ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(value: object) -> str:
    """Compact JSON (one shared encoder: json.dumps() with options builds one per call)."""
    return ENCODER.encode(value)


def validate_queue(queue: object) -> str:
    if not isinstance(queue, str):
        raise ValueError(f"queue name must be a str, got {short_repr(queue)}")
    if not queue or len(queue) > QUEUE_MAX_LENGTH or not QUEUE_RE.fullmatch(queue):
        raise ValueError(
            f"invalid queue name {short_repr(queue)}: use 1 to {QUEUE_MAX_LENGTH} letters, "
            "digits, '_', '-', '.' or ':'"
        )
    return queue


def validate_priority(priority: object) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority must be an int, got {short_repr(priority)}")
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise ValueError(
            f"priority {priority} is out of range: use {PRIORITY_MIN} to {PRIORITY_MAX}"
        )
    return priority


def validate_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > NAME_MAX_LENGTH:
        raise ValueError(
            f"job name must be a non-empty str of at most {NAME_MAX_LENGTH} characters, "
            f"got {short_repr(name)}"
        )
    if any(ch in name for ch in "\r\n\x00"):
        raise ValueError(f"job name must not contain line breaks or NUL: {short_repr(name)}")
    return name


def validate_unique_key(key: object, job_name: str) -> str | None:
    """A ``unique_key()`` result: a str of 1 to 200 characters, or None (not unique)."""
    if key is None:
        return None
    if not isinstance(key, str):
        raise TypeError(f"{job_name}.unique_key() must return a str or None, got {short_repr(key)}")
    if not key or len(key) > UNIQUE_KEY_MAX_LENGTH or _BAD_CHARS.search(key):
        raise ValueError(
            f"{job_name}.unique_key() returned {short_repr(key)}: use 1 to "
            f"{UNIQUE_KEY_MAX_LENGTH} characters, without NUL or lone surrogates"
        )
    return key


def validate_timeout(timeout: object) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ValueError(f"timeout must be a number of seconds or None, got {short_repr(timeout)}")
    if not 0 < timeout < math.inf:
        raise ValueError(f"timeout must be a positive finite number, got {timeout!r}")
    return float(timeout)


def resolve_when(wait: object = None, at: object = None) -> datetime | None:
    """Turn ``wait=`` / ``at=`` into an aware datetime, or None for "now, by database time"."""
    if wait is not None and at is not None:
        raise ValueError("pass either wait= or at=, not both")
    if wait is not None:
        if isinstance(wait, timedelta):
            seconds = wait.total_seconds()
        elif isinstance(wait, int | float) and not isinstance(wait, bool):
            try:
                seconds = float(wait)
            except OverflowError:
                raise ValueError(
                    f"wait= is too far in the future, got {short_repr(wait)}"
                ) from None
        else:
            raise ValueError(
                f"wait= must be a timedelta or a number of seconds, got {short_repr(wait)}"
            )
        if not seconds >= 0 or math.isinf(seconds):
            raise ValueError(f"wait= must be zero or positive and finite, got {short_repr(wait)}")
        if not seconds:
            return None
        try:
            return timezone.now() + timedelta(seconds=seconds)
        except OverflowError:
            raise ValueError(f"wait= is too far in the future, got {short_repr(wait)}") from None
    if at is not None:
        if not isinstance(at, datetime):
            raise ValueError(f"at= must be a datetime, got {short_repr(at)}")
        if timezone.is_naive(at):
            raise ValueError(
                f"at= must be timezone-aware, got the naive datetime {at.isoformat()}; "
                "use django.utils.timezone.make_aware() or datetime(..., tzinfo=...)"
            )
        return at
    return None
