"""Python's cyclic garbage collector, paused while a dispatch builds many objects.

A leaf of the package: dispatch_many's item parsing (queueable), its rows and its
returned Job objects (dispatch) all build one long-lived object or more per item.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

#: Fewest objects (items, rows, Jobs) for which the collector is paused.
PAUSE_ROWS = 200


def paused(count: int | None) -> AbstractContextManager[None]:
    """The cyclic garbage collector off while ``count`` objects are built (None: a number
    not known in advance), if they are many. Such objects are long-lived and free of
    cycles, so the collections their allocation triggers (every 700 objects, and now and
    then one that walks every object of the process) free nothing: measured, they took
    2.3 of the 2.9 microseconds a returned Job cost to build. The collector is turned
    back on at the end if it was on; what was allocated meanwhile is looked at by its
    next collection. (Another thread of the process that switches the collector off
    itself meanwhile finds it on again after that: collections are only deferred, never
    lost.) For a few objects (a single dispatch) the same do-nothing context every time:
    a generator-based one made per call cost more than a microsecond each."""
    if (count is not None and count < PAUSE_ROWS) or not gc.isenabled():
        return _UNPAUSED
    return _paused()


_UNPAUSED: AbstractContextManager[None] = nullcontext()


@contextmanager
def _paused() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
