"""Batch membership as the job verbs see it: the hooks that settle a batch after members
end (cancel, discard) and re-open one before dead members run again (retry), in the same
transaction. The statements live in :mod:`django_gator.engines.batching`, above the
models; the app's ``ready()`` installs them here (see :func:`install`)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, NamedTuple, TypeVar

#: (alias, batch ids): run in the open transaction of ``alias``.
Hook = Callable[[str, Collection[int]], None]
_settle: Hook | None = None
_reopen: Hook | None = None

#: A member's id in a Probe when the engine saw such a member locked by another
#: transaction, which is changing it (MariaDB's locking reads; see engines/batching.py).
LOCKED = -1


class Probe(NamedTuple):
    """What a batch step needs to know of its batch, read under the lock of its row."""

    closed: bool
    #: A member is waiting, failed or running (or may be: LOCKED counts as active).
    active: bool
    #: The id of a dead member, LOCKED, or None if there is none.
    dead: int | None
    #: The id of a cancelled member, LOCKED, or None if there is none.
    cancelled: int | None


#: (alias, batch id) -> its Probe, or None if the batch's row is gone.
ProbeHook = Callable[[str, int], Probe | None]
_probe: ProbeHook | None = None
H = TypeVar("H")


def install(settle: Hook | None, reopen: Hook | None, probe: ProbeHook | None = None) -> None:
    """Install the statements that settle batches (lock each row, dispatch the callbacks
    that are due), re-open them (a new completion generation) and probe them (lock the row,
    read what a batch step needs)."""
    global _settle, _reopen, _probe
    _settle, _reopen, _probe = settle, reopen, probe


def installed() -> bool:
    return None not in (_settle, _reopen, _probe)


def _hook(hook: H | None) -> H:
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


def probe(alias: str, batch_id: int) -> Probe | None:
    """Lock the row of ``batch_id`` and read its members' states, in the open transaction
    of ``alias`` (None if the row is gone)."""
    return _hook(_probe)(alias, batch_id)


def batches_of(jobs: Any, states: Collection[str]) -> list[int]:
    """The batches of the jobs in ``jobs`` (a Job queryset) that are in ``states``."""
    return sorted(
        jobs.filter(state__in=states, batch_id__isnull=False)
        .order_by()
        .values_list("batch_id", flat=True)
        .distinct()
    )
