"""Imports asked for in code before Django's apps are ready (a Celery app's
``autodiscover_tasks()``), made by the app's ``ready()`` with those of
``GATOR_AUTODISCOVER``."""

from __future__ import annotations

#: Module names looked for in every app, and dotted paths of modules.
_requested_names: list[str] = []
_requested_paths: list[str] = []


def request_autodiscover(name: str) -> None:
    """Import the module ``name`` of every installed app when the apps are ready."""
    if name not in _requested_names:
        _requested_names.append(name)


def request_imports(paths: list[str]) -> None:
    """Import these modules when the apps are ready."""
    _requested_paths.extend(path for path in paths if path not in _requested_paths)


def requested_imports() -> list[str]:
    return list(_requested_paths)


def requested_names() -> list[str]:
    return list(_requested_names)
