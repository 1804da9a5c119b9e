"""What a job class is, read once from its definition: :class:`JobTraits`.

``Queueable.__init_subclass__`` checks a new job class's attributes here (a bad value is
refused at import, naming it) and stores the result as ``cls.traits``; dispatch, the
worker and the engines read the traits instead of working them out again per call.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterable
from typing import TYPE_CHECKING

from django_gator import limits, validation
from django_gator.retry import Retry
from django_gator.windows import Window, read_windows

if TYPE_CHECKING:
    from django_gator.queueable import Queueable

#: Keyword names that dispatch() takes for itself; a handler cannot use them as parameters.
DISPATCH_OPTIONS = frozenset({"wait", "at", "queue", "priority", "on_commit", "expires_at"})


@dataclasses.dataclass(frozen=True, slots=True)
class JobTraits:
    """A job class's traits, fixed when the class is defined.

    ``signature``: the handler's parameters (``handle()``'s without ``self``, or the
    ``@job`` function's). ``is_async``: the handler is ``async def`` (a worker runs it on
    its event loop). ``is_unique``: ``unique = True`` or a ``unique_key()`` of its own.
    ``is_limited``: a ``concurrency_limit`` or ``rate_limit``, so its rows carry a
    concurrency key. ``is_keyed``: a ``concurrency_key()`` of its own. ``is_fair``: a
    ``fairness_key()`` of its own (see docs/fairness.md). ``accepts_anything``:
    the handler takes ``*args`` (and perhaps ``**kwargs``) and nothing else. ``window``:
    its ``unique_for``, ``debounce`` or ``throttle`` (see :mod:`django_gator.windows`).
    ``expires``: seconds after its dispatch a job of the class may still start.
    ``encrypted``: ``encrypted = True`` (or a list of argument names), its data is sealed
    at rest (see :mod:`django_gator.encryption`). ``sealed_kwargs``: that list (only those
    keyword arguments are sealed, the other arguments stay in clear); None: all of them.
    """

    signature: inspect.Signature
    is_async: bool = False
    is_unique: bool = False
    is_limited: bool = False
    is_keyed: bool = False
    is_fair: bool = False
    accepts_anything: bool = False
    window: Window | None = None
    expires: float | None = None
    encrypted: bool = False
    sealed_kwargs: tuple[str, ...] | None = None


def _refuse_own_traits(cls: type[Queueable]) -> None:
    """``traits`` is django-gator's to set: a class attribute of that name would be lost."""
    if "traits" in vars(cls):
        raise TypeError(
            f"{cls.__qualname__}.traits is set by django-gator when the class is defined "
            f"(a JobTraits); rename the class attribute, got {vars(cls)['traits']!r}"
        )


def read_traits(cls: type[Queueable], base: type[Queueable]) -> JobTraits:
    """Check the class attributes of the job class ``cls`` (TypeError or ValueError naming
    the bad one) and return its traits; ``base`` is Queueable, whose methods ``cls`` may
    override."""
    where = cls.__qualname__
    _refuse_own_traits(cls)
    validation.validate_name(cls.name)
    validation.validate_queue(cls.queue)
    validation.validate_priority(cls.priority)
    validation.validate_timeout(cls.timeout)
    _check_plain_attributes(cls, base)
    is_async = cls._handler_is_async()
    if is_async and cls.atomic:
        raise TypeError(
            f"{where} is an async job (its handler is `async def`) and sets "
            "atomic = True, which cannot be honoured: its ORM calls run in a thread that "
            "every async job of the worker shares, outside any transaction of the "
            "worker's; write the transaction inside the job (sync_to_async around a "
            "function that uses transaction.atomic()), or make handle() a plain def"
        )
    is_unique = cls.unique or cls.unique_key is not base.unique_key
    is_limited, is_keyed = _limits(cls, base)
    window, expires = read_windows(cls, is_unique)
    signature = cls._handler_signature()
    clash = DISPATCH_OPTIONS & {
        p.name
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    if clash and not cls._options_apart_from_arguments:
        raise TypeError(
            f"{where}.handle() has the {_parameters(clash)}, which "
            f"dispatch() takes as options ({', '.join(sorted(DISPATCH_OPTIONS))}); "
            "rename them"
        )
    kinds = [p.kind for p in signature.parameters.values()]
    return JobTraits(
        signature=signature,
        is_async=is_async,
        is_unique=is_unique,
        is_limited=is_limited,
        is_keyed=is_keyed,
        is_fair=cls.fairness_key is not base.fairness_key,
        window=window,
        expires=expires,
        encrypted=bool(cls.encrypted),
        sealed_kwargs=_sealed_kwargs(cls, signature),
        accepts_anything=kinds
        in (
            [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD],
            [inspect.Parameter.VAR_POSITIONAL],
        ),
    )


def _check_plain_attributes(cls: type[Queueable], base: type[Queueable]) -> None:
    """retry, handle(), the flags and middleware: TypeError naming the bad one."""
    where = cls.__qualname__
    if cls.retry is not None and not isinstance(cls.retry, Retry):
        raise TypeError(f"{where}.retry must be a django_gator.Retry or None, got {cls.retry!r}")
    if cls.handle is base.handle:
        raise TypeError(f"{where} must define handle()")
    for flag in ("unique", "atomic"):
        if not isinstance(getattr(cls, flag), bool):
            raise TypeError(f"{where}.{flag} must be True or False, got {getattr(cls, flag)!r}")
    if isinstance(cls.middleware, str | bytes) or not all(callable(m) for m in cls.middleware):
        raise TypeError(
            f"{where}.middleware must be a list of callables "
            f"(job, call_next), got {cls.middleware!r}"
        )


def _sealed_kwargs(cls: type[Queueable], signature: inspect.Signature) -> tuple[str, ...] | None:
    """``encrypted`` checked: True or False (None: all the data is sealed, or none), or a
    list of the names of keyword arguments of the handler (those are sealed)."""
    where, value = cls.__qualname__, cls.encrypted
    if isinstance(value, bool):
        return None
    if not isinstance(value, list | tuple) or not value:
        raise TypeError(
            f"{where}.encrypted must be True, False or a non-empty list of keyword argument "
            f"names, got {value!r}"
        )
    names = {
        p.name
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    for name in value:
        if not isinstance(name, str) or not name.isidentifier():
            raise TypeError(f"{where}.encrypted lists {name!r}, which is not an argument name")
        if name not in names and not takes_any:
            raise ValueError(
                f"{where}.encrypted lists {name!r}, which is not an argument of its handler "
                f"(it takes {', '.join(sorted(names)) or 'none'})"
            )
    if len(set(value)) != len(value):
        raise ValueError(f"{where}.encrypted lists an argument twice: {value!r}")
    return tuple(value)


def _limits(cls: type[Queueable], base: type[Queueable]) -> tuple[bool, bool]:
    """Validate the class's flow-control attributes (ValueError naming the bad value);
    whether it is limited, and whether it has a concurrency_key() of its own."""
    where = cls.__qualname__
    try:
        limits.validate_concurrency(cls.concurrency_limit, f"{where}.concurrency_limit")
        limits.parse_rate(cls.rate_limit, f"{where}.rate_limit")
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    limited = cls.concurrency_limit is not None or bool(cls.rate_limit)
    keyed = cls.concurrency_key is not base.concurrency_key
    if keyed and not limited:
        raise TypeError(
            f"{where} defines concurrency_key() but neither concurrency_limit nor rate_limit"
        )
    return limited, keyed


def _parameters(names: Iterable[str]) -> str:
    """``parameter 'wait'`` or ``parameters 'at', 'wait'``."""
    shown = sorted(names)
    word = "parameter" if len(shown) == 1 else "parameters"
    return f"{word} {', '.join(repr(name) for name in shown)}"
