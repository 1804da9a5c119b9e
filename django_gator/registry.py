"""The job registry: job name -> job class.

It is the only way a row's ``name`` becomes code: the worker never imports a module or
resolves a dotted path taken from the database, so a tampered row can at worst end ``dead``
with "job name ... is not registered". Job classes register themselves when they are
defined (:mod:`django_gator.queueable`); dispatch, redaction, schedules and the worker look
them up here.
"""

from __future__ import annotations

import difflib
import threading
from typing import TYPE_CHECKING

from django_gator.exceptions import AlreadyRegistered, JobNotRegistered

if TYPE_CHECKING:
    from django_gator.queueable import Queueable

_registry: dict[str, type[Queueable]] = {}
_registry_lock = threading.Lock()


def register(cls: type[Queueable]) -> type[Queueable]:
    """Add a job class to the registry under ``cls.name``."""
    name = cls.name
    with _registry_lock:
        existing = _registry.get(name)
        if existing is not None and existing is not cls and not _same_definition(existing, cls):
            raise AlreadyRegistered(
                f"job name {name!r} is already registered by {existing.__module__}."
                f"{existing.__qualname__}; give one of them another `name`"
            )
        _registry[name] = cls
    return cls


def _same_definition(a: type, b: type) -> bool:
    # The same class body executed twice (a module re-imported by the autoreloader or a test).
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def unregister(name: str) -> None:
    with _registry_lock:
        _registry.pop(name, None)


def get_job_class(name: str) -> type[Queueable]:
    """The job class registered under ``name`` (a job's ``name``: ``module.QualName``
    unless the class sets ``name``), as the worker finds the code for a row.

    Use it to reach a class from a name you have, a row's ``Job.name`` or a setting's
    string, without importing a dotted path: only classes that registered themselves
    (every :class:`~django_gator.Queueable` subclass and ``@job`` function, when its
    module is imported) can be returned. ``get_job_class(job.name).dispatch(...)``
    dispatches another job of a row's class.

    Raises :class:`~django_gator.exceptions.JobNotRegistered` when there is none; its
    message suggests up to three registered names close to ``name`` (a typo). A class
    whose module was never imported (not a ``jobs`` module, nor in ``GATOR_AUTODISCOVER``)
    is not registered.
    """
    try:
        return _registry[name]
    except (KeyError, TypeError):
        matches: list[str] = []
        if isinstance(name, str) and len(name) <= 1000:
            # Close enough to be a typo of a registered name, not merely alike.
            matches = difflib.get_close_matches(name, list(_registry), n=3, cutoff=0.8)
        raise JobNotRegistered(name if isinstance(name, str) else repr(name), matches) from None


def is_registered(job_class: type) -> bool:
    """Whether ``job_class`` is the class registered under its name."""
    name = getattr(job_class, "name", None)
    return isinstance(name, str) and _registry.get(name) is job_class


def registered_jobs() -> dict[str, type[Queueable]]:
    with _registry_lock:
        return dict(_registry)
