"""PostgreSQL: a thread that LISTENs for dispatches and wakes the fetcher, so an idle
worker starts a new job within milliseconds of its commit instead of at its next poll."""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection

from django_gator.engines.base import Engine
from django_gator.worker.retrier import backoff
from django_gator.worker.slots import Slots

logger = logging.getLogger("django_gator.worker")


def listen(
    engine: Engine,
    slots: Slots,
    queues: Collection[str],
    stopped: threading.Event,
    worker_id: str,
) -> None:
    """Wake the fetcher when a dispatch for one of ``queues`` (any queue if empty)
    commits, until ``stopped`` is set. A lost connection is reopened with a backoff; the
    fetcher polls meanwhile."""
    wanted = set(queues)
    failures = 0
    while not stopped.is_set():
        try:
            with engine.listen() as listener:
                failures = 0
                while not stopped.is_set():
                    notified = listener.wait(1.0)
                    if notified and (not wanted or wanted & notified):
                        slots.notify_fetcher(notified=True)
        except Exception:
            failures += 1
            logger.warning(
                "LISTEN connection failed; polling until it is back worker=%s",
                worker_id,
                exc_info=failures == 1,
            )
            stopped.wait(backoff(failures))
