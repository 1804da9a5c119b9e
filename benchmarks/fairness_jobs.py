"""The job of benchmarks/fairness.py: a no-op of a tenant, dispatched with ``queue=`` to a
fair queue and to a plain one. Not in django_gator itself: its ``fairness_key()`` on a
queue no setting makes fair would raise W009 wherever the package's modules are imported."""

from __future__ import annotations

from typing import Any

from django_gator.queueable import Queueable


class BenchTenant(Queueable):
    name = "benchmarks.fairness.tenant"
    queue = "bench-fair"  # benchmarks/fairness.py makes it fair (and dispatches to a plain one)

    def fairness_key(self, tenant: str, n: int = 0) -> str:
        return tenant

    def handle(self, *args: Any) -> None:
        return None
