"""``python -m benchmarks.wait_result``: how long after a job's end ``job.wait_result()``
returns (and ``await job.await_result()``), on the database of ``DATABASE_URL``.

A worker runs in a thread of this process (as ``gator_bench``'s latency measurement does),
serving ``gator_bench``'s queue. Each sample dispatches a no-op job due a random 0 to
``--spread`` seconds later (so the job ends at a random point of the waiter's backoff,
in its first steps or at its longest pause) and waits for it; the lag is the moment the
wait returned (this machine's clock) minus the job's ``finished_at`` (the database's
clock: run the server on the same machine, as here, or keep both on NTP). Prints the
median, the 90th and 99th percentiles and the maximum, in milliseconds, and the reads one
wait made (the statements on the waiter's connection).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/gator_bench \\
        python -m benchmarks.wait_result --samples 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import threading
import time
from typing import Any


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.wait_result", description=__doc__)
    p.add_argument("--samples", type=int, default=200, help="waits of each kind")
    p.add_argument("--spread", type=float, default=1.5, help="seconds: the jobs' due times")
    p.add_argument("--seed", type=int, default=34)
    return p


def measure(samples: int, spread: float, rng: random.Random) -> dict[str, Any]:
    from django.db import connection, connections
    from django.test.utils import CaptureQueriesContext

    from django_gator import bench
    from django_gator.worker.queues import QueueSpec
    from django_gator.worker.supervisor import WorkerProcess

    bench.clean()
    worker = WorkerProcess([QueueSpec(bench.QUEUE)], concurrency=4, install_signal_handlers=False)

    def run() -> None:
        try:
            worker.run()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, name="wait-result-worker", daemon=True)
    thread.start()
    lags: dict[str, list[float]] = {"wait_result": [], "await_result": []}
    reads: list[int] = []
    try:
        for i in range(2 * samples):
            kind = "wait_result" if i % 2 == 0 else "await_result"
            job = bench.BenchNoop.dispatch(wait=rng.uniform(0, spread))
            if kind == "wait_result":
                with CaptureQueriesContext(connection) as queries:
                    job.wait_result(timeout=30)
                reads.append(len(queries))
            else:
                asyncio.run(job.await_result(timeout=30))
            returned = time.time()
            job.refresh_from_db(fields=["finished_at"])
            assert job.finished_at is not None
            lags[kind].append((returned - job.finished_at.timestamp()) * 1000)
    finally:
        worker.request_stop()
        thread.join(30)
        bench.clean()
    report: dict[str, Any] = {"vendor": connection.vendor, "samples": samples, "spread_s": spread}
    for kind, values in lags.items():
        q = statistics.quantiles(values, n=100, method="inclusive")
        report[kind] = {
            "median_ms": round(statistics.median(values), 1),
            "p90_ms": round(q[89], 1),
            "p99_ms": round(q[98], 1),
            "max_ms": round(max(values), 1),
        }
    report["reads_per_wait"] = {"median": statistics.median(reads), "max": max(reads)}
    return report


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "testproject"))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    print(json.dumps(measure(args.samples, args.spread, random.Random(args.seed)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
