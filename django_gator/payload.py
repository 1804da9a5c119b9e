"""Job arguments as the JSON their rows store: one job's (:func:`encode_payload`), or many
jobs' at once, a column at a time (:func:`encode_columns`). Both check the values with
:func:`~django_gator.validation.check_json` and the size with ``GATOR_MAX_PAYLOAD_BYTES``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django_gator import conf
from django_gator.exceptions import PayloadTooLarge, ResultNotJSON, ResultTooLarge
from django_gator.logutil import safe
from django_gator.rows import ClaimedJob
from django_gator.validation import ENCODER, check_json, dumps


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


def encode_result(result: Any, what: str) -> str:
    """What a job returned, as the JSON its row stores (checked by the caller);
    :class:`~django_gator.exceptions.ResultTooLarge` past ``GATOR_MAX_RESULT_BYTES``.
    ``what`` names the job in the error."""
    text = _dumps_checked(result)
    limit = conf.max_result_bytes()
    if limit is not None:
        size = _utf8_len(text)
        if size > limit:
            raise ResultTooLarge(
                f"the result of {what} is {size} bytes of JSON, over "
                f"GATOR_MAX_RESULT_BYTES={limit}; store large data elsewhere and return its id"
            )
    return text


def result_json(job: ClaimedJob, result: Any) -> str | None:
    """What handle() returned, as the JSON stored in the row's ``result``; None for None.
    The attempt fails (the exception is raised from the handler's attempt) with
    ResultNotJSON for a value JSON cannot hold, ResultTooLarge past
    ``GATOR_MAX_RESULT_BYTES``: a stored NULL would read as a returned None."""
    if result is None:
        return None
    try:
        check_json(result, "result")
    except TypeError as exc:
        what = str(exc).split("; pass ", 1)[0]  # check_json's advice is for arguments
        raise ResultNotJSON(
            f"job {job.id} ({safe(job.name)}) returned a value JSON cannot hold, so its "
            f"result cannot be stored: {what}; return JSON (a dict with str keys, list, "
            "str, int, float, bool or None), e.g. an id or an ISO 8601 string"
        ) from None
    return encode_result(result, f"job {job.id} ({job.name})")


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
        None, ENCODER.default, encoder.encode_basestring, None, ":", ",", False, False, False
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
