"""Figures read from the database for the metrics view, kept in the Django cache
``GATOR_METRICS_CACHE`` for ``GATOR_METRICS_CACHE_SECONDS`` (the queues' figures, the
workflows' waits)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.core.cache import caches

from django_gator import conf


def cached(key: str, read: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """What ``read()`` returns (a dict with ``"at"``, the unix time it was read), read
    again at most once per ``GATOR_METRICS_CACHE_SECONDS`` and kept under ``key`` in the
    Django cache ``GATOR_METRICS_CACHE``.

    With a cache the replicas share (Redis, Memcached, the database cache), one replica
    refreshes them per interval: the first to take a short lock (``cache.add``) reads the
    database, and the others serve the figures stored until the new ones are in. With
    a per-process cache (LocMemCache, Django's default) each process refreshes once per
    interval."""
    interval = conf.metrics_cache_seconds()
    if interval <= 0:
        return read()
    cache = caches[conf.metrics_cache()]
    figures: dict[str, Any] | None = cache.get(key)
    if figures is not None and time.time() - figures["at"] < interval:
        return figures
    # Whoever takes the lock refreshes; the others keep serving what is stored.
    if figures is not None and not cache.add(f"{key}:refresh", 1, timeout=max(interval, 1)):
        return figures
    figures = read()
    cache.set(key, figures, timeout=max(interval * 4, 60))
    return figures
