"""prometheus_client, imported when metrics are first used (it is an optional extra)."""

from __future__ import annotations

from typing import Any


class MetricsUnavailable(RuntimeError):
    """prometheus_client is not installed."""


def client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise MetricsUnavailable(
            "Prometheus metrics need prometheus_client: pip install 'django-gator[prometheus]'"
        ) from None
    return prometheus_client
