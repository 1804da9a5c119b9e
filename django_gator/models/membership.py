"""Batch membership as the job verbs see it: the hooks that settle a batch after members
end (cancel, discard) and re-open one before dead members run again (retry), in the same
transaction. The statements live in :mod:`django_gator.engines.batching`, above the
models; the app's ``ready()`` installs them here (see :func:`install`)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

#: (alias, batch ids): run in the open transaction of ``alias``.
Hook = Callable[[str, Collection[int]], None]
_settle: Hook | None = None
_reopen: Hook | None = None


def install(settle: Hook | None, reopen: Hook | None) -> None:
    """Install the statements that settle batches (lock each row, dispatch the callbacks
    that are due) and re-open them (a new completion generation)."""
    global _settle, _reopen
    _settle, _reopen = settle, reopen


def _hook(hook: Hook | None) -> Hook:
    if hook is None:
        raise RuntimeError("django_gator is not ready: its batch statements are not installed")
    return hook


def settle(alias: str, batch_ids: Collection[int]) -> None:
    """Dispatch what is due for ``batch_ids``, in the open transaction of ``alias``."""
    if batch_ids:
        _hook(_settle)(alias, sorted(batch_ids))


def reopen(alias: str, batch_ids: Collection[int]) -> None:
    """Lock ``batch_ids`` and start a new generation of each completed one, before some of
    its dead members become waiting again (in the open transaction of ``alias``)."""
    if batch_ids:
        _hook(_reopen)(alias, sorted(batch_ids))


def batches_of(jobs: Any, states: Collection[str]) -> list[int]:
    """The batches of the jobs in ``jobs`` (a Job queryset) that are in ``states``."""
    return sorted(
        jobs.filter(state__in=states, batch_id__isnull=False)
        .order_by()
        .values_list("batch_id", flat=True)
        .distinct()
    )
