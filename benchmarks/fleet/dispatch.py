"""``python -m benchmarks.fleet.dispatch``: the fleet benchmark's dispatcher, a process of
its own (so that its CPU is measured apart from the harness's and the workers').

- ``--rate R``: R jobs per second, sent every 50 ms with ``dispatch_many`` (the jobs due
  by then; a late tick catches up), for ``--seconds``;
- ``--backlog B``: keeps B jobs waiting: every 250 ms counts the waiting jobs and tops up.

It prints a JSON line when it begins (``started``, Unix time), and when it stops (after
``--seconds`` or at SIGTERM) one more: jobs sent, seconds,
and the ticks that ran late (more than 100 ms behind: the dispatcher itself could not keep
up). The database and job come from the environment (benchmarks/fleet/settings.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any

TICK = 0.05
TOP_UP = 0.25
CHUNK = 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet.dispatch")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--rate", type=float, help="jobs per second")
    mode.add_argument("--backlog", type=int, help="jobs to keep waiting")
    parser.add_argument("--seconds", type=float, default=3600.0)
    parser.add_argument("--job", choices=("write", "noop"), default="write")
    options = parser.parse_args(argv)
    if options.rate is not None and options.rate <= 0:
        parser.error(f"--rate must be above 0, not {options.rate!r}")
    if options.backlog is not None and options.backlog <= 0:
        parser.error(f"--backlog must be above 0, not {options.backlog!r}")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.fleet.settings")
    import django

    django.setup()
    from benchmarks.fleet.app.jobs import JOBS

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    job = JOBS[options.job]
    print(json.dumps({"started": time.time()}), flush=True)
    if options.rate is not None:
        result = at_rate(job, options.rate, options.seconds, stop)
    else:
        result = keep_backlog(job, options.backlog, options.seconds, stop)
    print(json.dumps(result), flush=True)
    return 0


def send(job: Any, count: int) -> None:
    for start in range(0, count, CHUNK):
        job.dispatch_many([[]] * min(CHUNK, count - start))


def at_rate(job: Any, rate: float, seconds: float, stop: threading.Event) -> dict[str, Any]:
    started = time.monotonic()
    sent = late = 0
    tick = 0
    while not stop.is_set():
        now = time.monotonic()
        elapsed = now - started
        if elapsed >= seconds:
            break
        due = int(rate * elapsed) - sent
        if due > 0:
            send(job, due)
            sent += due
        tick += 1
        wait = started + tick * TICK - time.monotonic()
        if wait < -0.1:
            late += 1
            tick = int((time.monotonic() - started) / TICK) + 1
        elif wait > 0:
            stop.wait(wait)
    return {"sent": sent, "seconds": round(time.monotonic() - started, 3), "late_ticks": late}


def keep_backlog(job: Any, backlog: int, seconds: float, stop: threading.Event) -> dict[str, Any]:
    from benchmarks.fleet.app.jobs import QUEUE
    from django_gator.models import Job, JobState

    started = time.monotonic()
    sent = 0
    waiting = Job.objects.filter(queue=QUEUE, state=JobState.WAITING)
    while not stop.is_set() and time.monotonic() - started < seconds:
        missing = backlog - waiting.count()
        if missing > 0:
            send(job, missing)
            sent += missing
        stop.wait(TOP_UP)
    return {"sent": sent, "seconds": round(time.monotonic() - started, 3), "late_ticks": 0}


if __name__ == "__main__":
    sys.exit(main())
