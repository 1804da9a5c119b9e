"""Dispatchers racing a worker: threads dispatch keyed jobs as fast as they can for a set
time while a worker claims and marks them (tests/test_unique.py, tests/test_windows.py)."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from django.db import connections

from django_gator.queueable import Queueable
from django_gator.worker.queues import parse_queue_specs
from django_gator.worker.supervisor import WorkerProcess
from tests.conftest import start_worker_thread


@dataclass
class Race:
    """What the race saw: the dispatches that raised, each thread's count, the worker."""

    errors: list[BaseException] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    worker: WorkerProcess | None = None


def race(job_class: type[Queueable], keys: int, seconds: float, threads: int = 4) -> Race:
    """``threads`` threads dispatch ``job_class`` with a random key of ``keys`` for
    ``seconds`` while a worker of 4 threads serves its queue; the worker is stopped after."""
    seen = Race()
    stop = threading.Event()

    def dispatcher(seed: int) -> None:
        rng = random.Random(seed)
        count = 0
        try:
            while not stop.is_set():
                try:
                    job_class.dispatch(rng.randrange(keys))
                except Exception as exc:  # reported by the test
                    seen.errors.append(exc)
                count += 1
        finally:
            seen.calls.append(count)
            connections.close_all()  # this thread's

    worker = WorkerProcess(
        parse_queue_specs([job_class.queue]),
        concurrency=4,
        install_signal_handlers=False,
        poll_interval=0.01,
        scheduler=False,
    )
    seen.worker = worker
    worker_thread = start_worker_thread(worker)
    running = [threading.Thread(target=dispatcher, args=(i,), daemon=True) for i in range(threads)]
    for thread in running:
        thread.start()
    time.sleep(seconds)  # deliberate: the race runs for a fixed time
    stop.set()
    for thread in running:
        thread.join(timeout=60)
    worker.request_stop()
    worker_thread.join(timeout=60)
    assert not worker_thread.is_alive()
    return seen
