"""Deleting old rows a batch at a time: the jobs past their retention, and then the batches
and workflows none of whose jobs is left (see :meth:`JobQuerySet.prune`,
:meth:`BatchQuerySet.prune` and :meth:`WorkflowRunQuerySet.prune`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, ClassVar, NamedTuple

from django.db import connections, transaction


class Pruned(NamedTuple):
    """What a ``prune()`` did."""

    deleted: int
    batches: int
    #: It stopped at ``max_batches`` after a full batch: more rows may be left.
    stopped: bool


def delete_in_batches(
    rows: Any,
    order: Sequence[str],
    *,
    batch_size: int,
    max_batches: int | None,
    progress: Callable[[int], None] | None,
) -> Pruned:
    """Delete the rows of the queryset ``rows`` in ``order``, ``batch_size`` per short
    transaction so workers are never held up. The DELETE applies ``rows``' conditions
    again, so a row that changed between the read of a batch and its delete (a retried
    job, a batch that got a member) stays. ``progress`` is called with each batch's count
    of ``rows``' model (not of the rows that cascade). Stops when a batch comes back short
    (nothing left) or after ``max_batches`` batches."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size!r}")
    alias = rows.db
    label = rows.model._meta.label
    # SQLite limits the parameters of one statement; a few more go to the conditions.
    limit = connections[alias].features.max_query_params
    step = max(1, limit - 10) if limit else batch_size
    deleted = batches = 0
    while True:
        if max_batches is not None and batches >= max_batches:
            return Pruned(deleted, batches, stopped=True)
        ids = list(rows.order_by(*order).values_list("pk", flat=True)[:batch_size])
        if not ids:
            return Pruned(deleted, batches, stopped=False)
        count = 0
        with transaction.atomic(using=alias):
            for start in range(0, len(ids), step):
                _, per_model = rows.filter(pk__in=ids[start : start + step]).delete()
                count += per_model.get(label, 0)
        deleted += count
        batches += 1
        if progress is not None:
            progress(count)
        if len(ids) < batch_size:
            return Pruned(deleted, batches, stopped=False)


class Prunable:
    """``prune()`` for a queryset class with ``finished(before=...)``: the rows whose
    every job is gone (batches, workflows), deleted in ``prune_order``."""

    prune_order: ClassVar[tuple[str, ...]] = ("pk",)

    def finished(self, *, before: datetime | None = None) -> Any:
        raise NotImplementedError

    def prune(
        self,
        *,
        before: datetime | None = None,
        batch_size: int = 1000,
        max_batches: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Pruned:
        """Delete the finished rows of this queryset (with ``before``: finished before it),
        ``batch_size`` per transaction (see :func:`delete_in_batches`)."""
        return delete_in_batches(
            self.finished(before=before),
            self.prune_order,
            batch_size=batch_size,
            max_batches=max_batches,
            progress=progress,
        )
