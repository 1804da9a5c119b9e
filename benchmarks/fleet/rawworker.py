"""``python -m benchmarks.fleet.rawworker``: the fleet's control, a worker process without
django-gator (``python -m benchmarks.fleet --worker raw``).

It does what a gator_worker of the fleet does to the database, in the fewest statements a
job queue can: ``--concurrency`` threads, each with two psycopg connections of its own (one
for the queue's bookkeeping with ``synchronous_commit = off``, as the worker's; one for the
job's write, durable, as a job's), each thread in a loop:

- in one transaction on the bookkeeping connection: mark its previous job succeeded (by
  id) and claim the next (``FOR UPDATE SKIP LOCKED``, one job, the ready index's order and
  condition, as benchmarks/raw_baseline.py's raw drain);
- run it: ``fleet.write``'s INSERT of one row, committed (``--job noop``: nothing).

No Django, no fetcher thread, no batching, no hooks: what is left is what every queue on
PostgreSQL pays (round trips, commits, row locks, the GIL of its threads). Run in the
fleet's steps instead of gator_worker, it tells whether a fall of the throughput as
processes are added past the CPUs is django-gator's or the machine's. Each claim is timed
into ``$GATOR_SOAK_TIMINGS/timings-<pid>.log`` in the soak timer's format (``<unix time>
claim <microseconds> 1``). SIGTERM ends it: each thread marks its last job and closes.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from pathlib import Path

CLAIM = (
    "WITH picked AS (SELECT id FROM django_gator_job WHERE queue = 'fleet' AND state IN "
    "('waiting', 'failed') AND concurrency_key IS NULL "
    "AND next_execution_at <= statement_timestamp() "
    "ORDER BY priority DESC, next_execution_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) "
    "UPDATE django_gator_job AS j SET state = 'running', attempts = j.attempts + 1, "
    "reserved_by = %s, locked_at = statement_timestamp(), "
    "started_at = COALESCE(j.started_at, statement_timestamp()) FROM picked "
    "WHERE j.id = picked.id RETURNING j.id"
)
MARK = (
    "UPDATE django_gator_job SET state = 'succeeded', finished_at = statement_timestamp() "
    "WHERE id = %s AND state = 'running' AND reserved_by = %s"
)
WRITE = (
    "INSERT INTO gator_fleet_written (job_id, client_addr, written_at) "
    "VALUES (%s, inet_client_addr(), statement_timestamp())"
)
#: Seconds a thread waits when its claim found nothing.
IDLE = 0.005


class Timings:
    """The claims' durations, written to the timings file every second and at the end."""

    def __init__(self, directory: str | None) -> None:
        self.path = Path(directory, f"timings-{os.getpid()}.log") if directory else None
        self.lines: list[str] = []
        self.lock = threading.Lock()

    def add(self, seconds: float) -> None:
        if self.path is not None:
            with self.lock:
                self.lines.append(f"{time.time():.3f} claim {seconds * 1e6:.0f} 1\n")

    def flush(self) -> None:
        if self.path is None:
            return
        with self.lock:
            lines, self.lines = self.lines, []
        with self.path.open("a") as out:
            out.writelines(lines)


def work(url: str, name: str, job: str, stop: threading.Event, timings: Timings) -> None:
    import psycopg

    application = f"gator-fleet-{os.environ.get('GATOR_FLEET_ROLE', 'raw')}"
    with (
        psycopg.connect(url, application_name=application) as book,
        psycopg.connect(url, application_name=application) as writer,
    ):
        book.execute("SET synchronous_commit TO off")
        book.commit()
        held: int | None = None
        while True:
            started = time.perf_counter()
            if held is not None:
                book.execute(MARK, [held, name])
            if stop.is_set():
                book.commit()
                return
            row = book.execute(CLAIM, [name]).fetchone()
            book.commit()
            timings.add(time.perf_counter() - started)
            held = row[0] if row else None
            if held is None:
                stop.wait(IDLE)
            elif job == "write":
                writer.execute(WRITE, [held])
                writer.commit()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet.rawworker")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--job", choices=("write", "noop"), default="write")
    options = parser.parse_args(argv)
    url = os.environ["DATABASE_URL"].replace("postgres://", "postgresql://", 1)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    timings = Timings(os.environ.get("GATOR_SOAK_TIMINGS"))
    failures: list[BaseException] = []

    def run(index: int) -> None:
        try:
            work(url, f"raw-{os.getpid()}-{index}", options.job, stop, timings)
        except BaseException as exc:  # reported, and the process exits 1
            failures.append(exc)
            stop.set()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(options.concurrency)]
    for thread in threads:
        thread.start()
    while not stop.wait(1.0):
        timings.flush()
    for thread in threads:
        thread.join()
    timings.flush()
    for failure in failures:
        print(f"rawworker: a thread failed: {failure!r}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
