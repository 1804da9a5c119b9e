"""Keys and windows of a job class: :class:`Windows`, which :class:`~django_gator.Queueable`
inherits (``unique``'s key, ``unique_for``, ``debounce``, ``throttle``, ``expires``), and
their checks when a class is defined (:func:`read_windows`).

``unique_for``: the unique key stays taken for that long after the job finished (any final
state): a dispatch within the window returns the finished job, as one while it is active
returns the active one. ``debounce``: a dispatch with the key of a waiting job replaces its
arguments and moves its start to now + debounce (the last call wins). ``throttle``: at most
one job of the key starts per window; a dispatch while one waits joins it, and a new job
never starts before the window of the last start has passed. ``expires``: a job not started
within that time after its dispatch never runs (see :mod:`django_gator.expiry`).

Each of the three windows needs a key (``unique = True`` or a ``unique_key()`` of the
class's own) and a class has at most one of them. The database keeps them: see
``django_gator.engines.dedupe``.
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from django.utils import timezone

from django_gator.validation import short_repr

if TYPE_CHECKING:
    from django_gator.queueable import Queueable
    from django_gator.rows import JobRows

#: The class attributes that open a window on a unique key, in the order they are checked.
WINDOW_KINDS = ("unique_for", "debounce", "throttle")


class Window(NamedTuple):
    """A class's window: its kind (one of :data:`WINDOW_KINDS`) and its length in seconds."""

    kind: str
    seconds: float


class Windows:
    """The unique key and the windows of a job class (see the module's docstring)."""

    unique: ClassVar[bool] = False
    unique_for: ClassVar[timedelta | float | None] = None
    debounce: ClassVar[timedelta | float | None] = None
    throttle: ClassVar[timedelta | float | None] = None
    expires: ClassVar[timedelta | float | None] = None

    def unique_key(self, *args: Any, **kwargs: Any) -> str | None:
        """The key that makes a dispatch unique, from the dispatch's arguments.

        With ``unique = True`` the default is a digest of the arguments, bound to
        ``handle()``'s parameters (so ``dispatch(5)`` and ``dispatch(user_id=5)`` share a
        key). Override it to choose what makes two jobs the same (``f"user:{user_id}"``);
        return None to make one dispatch not unique. Keys are per job name.
        """
        if not type(self).unique:
            return None
        try:
            bound = type(self).traits.signature.bind(*args, **kwargs)  # type: ignore[attr-defined]
            bound.apply_defaults()
            identity: Any = bound.arguments
        except TypeError:
            identity = [args, kwargs]
        text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=repr)
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def seconds_of(value: object, where: str) -> float | None:
    """A window's length in seconds: a timedelta or a positive finite number, or None.
    ValueError naming ``where`` and the value otherwise."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ValueError(
            f"{where} must be a timedelta or a number of seconds (or None), got {value!r}"
        )
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"{where} must be positive and finite, got {value!r}")
    return seconds


def read_windows(cls: type[Queueable], is_unique: bool) -> tuple[Window | None, float | None]:
    """Check the class's window attributes and ``expires`` (ValueError or TypeError naming
    the class and attribute); its window, if any, and its expiry in seconds."""
    where = cls.__qualname__
    found = [
        Window(kind, seconds)
        for kind in WINDOW_KINDS
        if (seconds := seconds_of(getattr(cls, kind), f"{where}.{kind}")) is not None
    ]
    expires = seconds_of(cls.expires, f"{where}.expires")
    if len(found) > 1:
        names = " and ".join(w.kind for w in found)
        raise TypeError(
            f"{where} sets {names}: a class has at most one window on its unique key "
            "(unique_for keeps a finished job's key; debounce replaces a waiting job; "
            "throttle spaces starts); keep one"
        )
    if found and not is_unique:
        raise TypeError(
            f"{where}.{found[0].kind} applies per unique key, and {where} has none: set "
            "unique = True (a digest of the arguments) or define unique_key()"
        )
    return (found[0] if found else None), expires


def settle_dispatch(job_class: type[Queueable], rows: JobRows, expires_at: object) -> None:
    """The rows' expiry, from ``expires_at=`` (an aware datetime) or the class's
    ``expires``; ValueError naming a bad value. A debounced class decides its jobs' start
    itself: ``wait=``/``at=`` are refused for it."""
    traits = job_class.traits
    if traits.window is not None and traits.window.kind == "debounce" and rows.run_at:
        raise ValueError(
            f"{job_class.__qualname__}.debounce sets when its jobs start (now + "
            f"{traits.window.seconds:g} s at each dispatch); dispatch it without wait= or at="
        )
    if expires_at is None:
        rows.expires_in = traits.expires
        return
    if not isinstance(expires_at, datetime):
        raise ValueError(f"expires_at= must be a datetime, got {short_repr(expires_at)}")
    if timezone.is_naive(expires_at):
        raise ValueError(
            "expires_at= must be timezone-aware, got the naive datetime "
            f"{expires_at.isoformat()}; use django.utils.timezone.make_aware()"
        )
    if rows.run_at is not None and rows.run_at >= expires_at:
        raise ValueError(
            f"expires_at={expires_at.isoformat()} is not after the job's start "
            f"({rows.run_at.isoformat()}): it could never run"
        )
    rows.expires_at = expires_at
