"""Validation of everything a caller hands to dispatch: arguments, queues, priorities, times.

Errors name the bad value and where it sits (``args[1]['when']``), so the caller can fix
the call without reading our source.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from django_gator import conf
from django_gator.exceptions import PayloadTooLarge
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
    # Fast path: a flat list or dict of plain atoms (most job arguments).
    if isinstance(value, list) and type(value) is list:
        if all(_plain(v) for v in value):
            return
    elif (
        isinstance(value, dict)
        and type(value) is dict
        and all(type(k) is str and _clean_str(k) and _plain(v) for k, v in value.items())
    ):
        return
    stack: list[tuple[object, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, str):
            _check_str(item, where)
            continue
        if isinstance(item, int):
            if item.bit_length() > MAX_INT_BITS:
                raise TypeError(
                    f"{where} is an int of {item.bit_length()} bits, over the {MAX_INT_BITS} "
                    "that JSON is used with here; pass it as a str"
                )
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise TypeError(
                    f"{where} is {item!r}, which JSON cannot represent; "
                    "pass None or a finite number"
                )
            if abs(item) >= FLOAT_LIMIT:
                raise TypeError(
                    f"{where} is the float {item!r}; PostgreSQL's jsonb hands floats of 1e16 "
                    "and more back as ints: pass it as a str or an int"
                )
            continue
        if depth >= MAX_DEPTH and type(item) in (list, dict):
            raise TypeError(f"{where} is nested deeper than {MAX_DEPTH} levels")
        if type(item) is list:
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item))
            continue
        if type(item) is dict:
            for key, v in item.items():
                if not isinstance(key, str):
                    raise TypeError(
                        f"{where} has the key {short_repr(key)} of type "
                        f"{_type_name(key)}; JSON object keys must be str"
                    )
                _check_str(key, f"{where} key {short_repr(key)}")
                stack.append((v, f"{where}[{key!r}]", depth + 1))
            continue
        hint = " (tuples come back as lists: pass a list)" if isinstance(item, tuple) else ""
        raise TypeError(
            f"{where} is {article(_type_name(item))} ({short_repr(item)}), which does not "
            f"round-trip through JSON{hint}; pass JSON-compatible values (str, int, float, bool, "
            "None, list, dict with str keys), e.g. an id instead of a model instance"
        )


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


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(value: object) -> str:
    """Compact JSON (one shared encoder: json.dumps() with options builds one per call)."""
    return _ENCODER.encode(value)


def encode_payload(
    args: Sequence[Any], kwargs: Mapping[str, Any], limit: int | None = None
) -> tuple[str, str]:
    """Validate and serialize one job's arguments; returns (args_json, kwargs_json)."""
    args_list = list(args)
    check_json(args_list, "args")
    kwargs_dict = dict(kwargs)
    check_json(kwargs_dict, "kwargs")
    args_json = _dumps_checked(args_list) if args_list else "[]"
    kwargs_json = _dumps_checked(kwargs_dict) if kwargs_dict else "{}"
    if limit is None:
        limit = conf.max_payload_bytes()
    size = _utf8_len(args_json) + _utf8_len(kwargs_json)
    if size > limit:
        raise PayloadTooLarge(
            f"job payload is {size} bytes, over GATOR_MAX_PAYLOAD_BYTES={limit}; "
            "store large data elsewhere and pass its id"
        )
    return args_json, kwargs_json


def _column_encoder() -> Callable[[object, int], list[str]] | None:
    """:func:`dumps` made once at C level (None without the C accelerator): calling
    ``JSONEncoder.encode`` builds a new C encoder every time, which costs more than
    encoding a short argument list. The same options, so the same text; no check for
    circular references (it is given only lists and dicts of atoms). Called with the value
    and 0, it returns the text in one or more pieces."""
    from json import encoder

    make = getattr(encoder, "c_make_encoder", None)
    if make is None:
        return None
    return make(
        None, _ENCODER.default, encoder.encode_basestring, None, ":", ",", False, False, False
    )


_C_ENCODER = _column_encoder()
#: The types a row may hold, at the top of its args list or as a kwargs value, to be
#: checked by column (subclasses, containers and the rest go through check_json).
_ATOMS = frozenset({str, int, float, bool, type(None)})
_STR = frozenset({str})
#: What, in JSON text of atoms, may stand for a value check_json refuses: an escaped NUL, a
#: lone surrogate, or an exponent (floats from 1e16 up print as 1e+16).
_DOUBTFUL = re.compile(r"\\u0000|[\ud800-\udfff]|e\+")
#: Rows whose JSON is longer than this many characters are checked one by one: an int of
#: over MAX_INT_BITS bits prints over 4,214 digits.
_LONG = 4000


def encode_columns(
    args_col: list[list[Any]], kwargs_col: list[dict[str, Any]], limit: int
) -> tuple[list[str], list[str], list[int]]:
    """Serialize the arguments of many jobs at once, as :func:`encode_payload` would each
    job's; returns (args JSON, kwargs JSON, doubtful).

    Rows made of atoms (str, int, float, bool and None at the top of args, str keys and
    atom values in kwargs) are checked a column at a time, with set operations and one
    regular expression over their JSON, and encoded by one C encoder. ``doubtful`` lists,
    in order, the rows those checks could not clear (nested values, subclasses, NUL and
    lone surrogates, large numbers, payloads near the limit): their entries here are
    placeholders, and each must go through :func:`encode_payload`, which raises for a bad
    one and otherwise returns its JSON."""
    count = len(args_col)
    if not count:
        return [], [], []
    any_kwargs = any(kwargs_col)
    flat: list[bool] | None = None  # None: every row is flat
    if not _ATOMS.issuperset(map(type, itertools.chain.from_iterable(args_col))) or (
        any_kwargs
        and not (
            _STR.issuperset(map(type, itertools.chain.from_iterable(kwargs_col)))
            and _ATOMS.issuperset(
                map(type, itertools.chain.from_iterable(map(dict.values, kwargs_col)))
            )
        )
    ):
        flat = [
            _ATOMS.issuperset(map(type, args))
            and (
                not kwargs
                or (
                    _STR.issuperset(map(type, kwargs))
                    and _ATOMS.issuperset(map(type, kwargs.values()))
                )
            )
            for args, kwargs in zip(args_col, kwargs_col, strict=True)
        ]
    doubtful: set[int] = set()
    args_json = _encode_rows(args_col, flat, "[]", doubtful)
    kwargs_json = _encode_rows(kwargs_col, flat, "{}", doubtful) if any_kwargs else ["{}"] * count
    if flat is not None:
        doubtful.update(index for index, ok in enumerate(flat) if not ok)
    longest = min(_LONG, limit // 4)  # UTF-8 takes at most 4 bytes a character
    for column in (args_json, kwargs_json):
        if _may_be_doubtful("".join(column)):
            doubtful.update(i for i, text in enumerate(column) if _DOUBTFUL.search(text))
    if max(map(len, args_json)) + max(map(len, kwargs_json)) > longest:
        doubtful.update(
            i
            for i, (a, k) in enumerate(zip(args_json, kwargs_json, strict=True))
            if len(a) + len(k) > longest
        )
    return args_json, kwargs_json, sorted(doubtful)


def _dumps_checked(value: list[Any] | dict[str, Any]) -> str:
    """:func:`dumps` of a value check_json accepted (so neither circular nor too deep for
    the encoder without the check for cycles)."""
    if _C_ENCODER is None:
        return dumps(value)
    return "".join(_C_ENCODER(value, 0))


def _may_be_doubtful(text: str) -> bool:
    """Whether _DOUBTFUL may match in ``text``: the same answer as searching it, found with
    substring tests (a few milliseconds for 100,000 rows, against 30 for the search)."""
    if "\\u0000" in text or "e+" in text:
        return True
    if text.isascii():
        return False
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate
        return True
    return False


def _encode_rows(
    column: Sequence[list[Any] | dict[str, Any]],
    flat: list[bool] | None,
    empty: str,
    failed: set[int],
) -> list[str]:
    """The JSON of each flat row of ``column`` (``empty`` for an empty one); the others,
    and those the encoder refuses (NaN, ints too long to print), get a placeholder and
    their index in ``failed``."""
    encoder = _C_ENCODER
    join = "".join
    try:
        if encoder is None:
            return [
                dumps(value) if value and (flat is None or flat[index]) else empty
                for index, value in enumerate(column)
            ]
        if flat is None:
            return [join(encoder(value, 0)) if value else empty for value in column]
        return [
            join(encoder(value, 0)) if value and ok else empty
            for value, ok in zip(column, flat, strict=True)
        ]
    except (TypeError, ValueError, OverflowError, RecursionError):
        pass
    out = []
    for index, value in enumerate(column):
        text = empty
        if value and (flat is None or flat[index]):
            try:
                text = dumps(value)
            except (TypeError, ValueError, OverflowError, RecursionError):
                failed.add(index)
        out.append(text)
    return out


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


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
