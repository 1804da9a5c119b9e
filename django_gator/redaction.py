"""Masking secrets in what operators see: admin pages and log lines.

``GATOR_REDACT`` names argument keys (compared without case) whose values are never shown;
a job class adds its own with ``redact = ["card_token"]``. A key matches a dict key at any
depth of the arguments and the result, and a positional argument whose ``handle()``
parameter has that name. Values found that way are also masked wherever they appear in error
messages and tracebacks (a secret that ended up in an exception message).

The database keeps the real values: workers need them. Redaction is for display. A sealed
value (the data of a job class with ``encrypted = True``, see :mod:`django_gator.encryption`)
is shown as ``[encrypted]`` wherever this module shows a payload or a value.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django_gator import conf
from django_gator.encryption import SHOWN, holds_sealed, is_sealed
from django_gator.exceptions import JobNotRegistered
from django_gator.registry import get_job_class

MASK = "[redacted]"
#: Shortest secret value masked inside free text (shorter ones would mask ordinary words).
MIN_SECRET_LENGTH = 4


def is_encrypted(job_name: str) -> bool:
    """Whether the job class registered as ``job_name`` has ``encrypted = True``."""
    try:
        return bool(get_job_class(job_name).traits.encrypted)
    except (JobNotRegistered, AttributeError):
        return False


def keys_for(job_name: str) -> frozenset[str]:
    """The redacted keys of a job: the setting's, plus its class's ``redact``."""
    keys = set(conf.redact_keys())
    with contextlib.suppress(JobNotRegistered):
        keys.update(k.lower() for k in getattr(get_job_class(job_name), "redact", ()) or ())
    return frozenset(keys)


def _positional_names(job_name: str, count: int) -> list[str | None]:
    try:
        signature = get_job_class(job_name).traits.signature
    except (JobNotRegistered, AttributeError):
        return [None] * count
    names: list[str | None] = []
    for param in signature.parameters.values():
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            names.append(param.name)
        elif param.kind is inspect.Parameter.VAR_POSITIONAL:
            break
    return (names + [None] * count)[:count]


def redact_value(value: Any, keys: frozenset[str]) -> Any:
    """``value`` with the values under ``keys`` (at any depth) replaced by MASK; a sealed
    value is ``[encrypted]``."""
    if is_sealed(value):
        return SHOWN
    if not keys:
        return value
    if isinstance(value, Mapping):
        return {
            k: MASK if isinstance(k, str) and k.lower() in keys else redact_value(v, keys)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_value(v, keys) for v in value]
    return value


def redact_payload(job_name: str, args: Any, kwargs: Any) -> tuple[Any, Any]:
    """(args, kwargs) of a job as an operator may see them: ``[encrypted]`` if sealed."""
    if is_sealed(args) or is_sealed(kwargs):
        return SHOWN, SHOWN
    if holds_sealed(kwargs):  # encrypted = [names]: those values are [encrypted]
        kwargs = {k: SHOWN if is_sealed(v) else v for k, v in kwargs.items()}
    keys = keys_for(job_name)
    if not keys:
        return args, kwargs
    if isinstance(args, list):
        names = _positional_names(job_name, len(args))
        args = [
            MASK if name is not None and name.lower() in keys else redact_value(value, keys)
            for name, value in zip(names, args, strict=True)
        ]
    return args, redact_value(kwargs, keys)


def secret_values(job_name: str, args: Any, kwargs: Any) -> list[str]:
    """The texts of the redacted values of a payload, longest first."""
    keys = keys_for(job_name)
    if not keys:
        return []
    found: list[str] = []

    def collect(value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                if isinstance(k, str) and k.lower() in keys:
                    found.extend(_texts(v))
                else:
                    collect(v)
        elif isinstance(value, list | tuple):
            for v in value:
                collect(v)

    if isinstance(args, list):
        for name, value in zip(_positional_names(job_name, len(args)), args, strict=True):
            if name is not None and name.lower() in keys:
                found.extend(_texts(value))
            else:
                collect(value)
    collect(kwargs)
    return sorted({t for t in found if len(t) >= MIN_SECRET_LENGTH}, key=len, reverse=True)


def job_secret_values(job_name: str, args: Any, kwargs: Any, audit: Any) -> list[str]:
    """:func:`secret_values` of a job's payload and of every payload its argument edits
    replaced or wrote (kept in its audit trail): a secret an edit changed is still in the
    error messages and tracebacks of the attempts that ran with it. Longest first."""
    found = set(secret_values(job_name, args, kwargs))
    for entry in audit if isinstance(audit, list) else ():
        if not isinstance(entry, Mapping):
            continue
        for key in ("before", "after"):
            payload = entry.get(key)
            if isinstance(payload, Mapping):
                found.update(secret_values(job_name, payload.get("args"), payload.get("kwargs")))
    return sorted(found, key=len, reverse=True)


def _texts(value: Any) -> Iterable[str]:
    if isinstance(value, Mapping):
        for v in value.values():
            yield from _texts(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _texts(v)
    elif value is not None and not isinstance(value, bool):
        yield str(value)


def mask_text(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every secret value replaced by MASK."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text
