"""``python -m benchmarks.dispatch_cost``: where a single ``dispatch()`` spends its time
against the driver, in one process, on PostgreSQL (issue 31 item 2).

Three ways of inserting one due job, each committed on its own (autocommit, one round trip),
run in alternating blocks (``--block`` jobs, ``--blocks`` per step, the steps' order turned
by one each block) so that a drift in the machine's load falls on every step alike:

- ``raw``: psycopg alone, autocommit, ``INSERT ... RETURNING id`` prepared by psycopg
  (the fair bar of docs/benchmarks.md: ``benchmarks.raw_baseline``'s
  ``single-autocommit`` statement);
- ``statement``: psycopg alone, autocommit, prepared, the statement ``dispatch()`` sends
  (its columns, ``RETURNING id, created_at`` and the NOTIFY), its row read in binary;
- ``dispatch``: ``BenchNoop.dispatch(i)``, the whole pipeline.

Per step: the client's CPU per job (``time.process_time``) and the wall time per job, the
median of the blocks; and ``dispatch``'s rate over ``raw``'s, block by block (median and
range). The database's name must contain ``raw``: every job in it is deleted.

``--think 0,100,200``: instead, the ``raw`` statement alone, with that many microseconds of
client CPU (a busy loop) before each one, ``--block`` statements per think time, the think
times in turn, ``--blocks`` rounds: the wall time of the statement alone, median per think
time (on a virtual machine, a round trip can cost more when the client worked longer
since the last one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

RAW_SQL = (
    "INSERT INTO django_gator_job (name, args, kwargs, queue, priority, next_execution_at, "
    "created_at, state, attempts, rescues, last_error) VALUES (%s, %s::jsonb, %s::jsonb, "
    "%s, %s, statement_timestamp(), statement_timestamp(), 'waiting', 0, 0, '') "
    "RETURNING id"
)
STEPS = ("raw", "statement", "dispatch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    parser.add_argument("--block", type=int, default=500)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--synchronous-commit", choices=["on", "off"], default="on")
    parser.add_argument("--json", action="store_true", help="one JSON line instead of a table")
    parser.add_argument(
        "--think",
        type=lambda text: [int(part) for part in text.split(",")],
        help="comma-separated microseconds of client CPU before each raw statement",
    )
    args = parser.parse_args()
    url = args.database_url or ""
    if not url.startswith(("postgres://", "postgresql://")) or "raw" not in url.rsplit("/", 1)[-1]:
        sys.exit(
            f"--database-url {url!r}: a PostgreSQL database whose name contains 'raw' "
            "(every job in it is deleted)"
        )
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.pickup.settings")
    import django

    django.setup()
    if args.think:
        thought = think(args.think, args.block, args.blocks, args.synchronous_commit)
        if args.json:
            print(json.dumps(thought))
            return
        print(f"raw statement's wall time after client CPU, {args.blocks} rounds of {args.block}")
        for micros, walls in thought["wall_us"].items():
            rounds = ", ".join(f"{wall:.0f}" for wall in walls)
            print(f"think {micros:>5} us: median {statistics.median(walls):.0f} us ({rounds})")
        return
    result = run(url, args.block, args.blocks, args.synchronous_commit)
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{args.blocks} blocks of {args.block} jobs a step, synchronous_commit "
        f"{args.synchronous_commit}, load {result['load']:.1f}"
    )
    print(f"{'step':<10} {'CPU us/job':>11} {'wall us/job':>12}")
    for step in STEPS:
        print(f"{step:<10} {result['cpu_us'][step]:>11.1f} {result['wall_us'][step]:>12.1f}")
    ratios = result["dispatch_over_raw"]
    print(
        f"dispatch / raw, rate, per block: median {statistics.median(ratios):.2f} "
        f"(range {min(ratios):.2f}-{max(ratios):.2f})"
    )


def _raw_connection(synchronous_commit: str) -> Any:
    import psycopg
    from django.db import connection

    dsn = connection.get_connection_params()
    raw = psycopg.connect(
        **{k: v for k, v in dsn.items() if k in ("dbname", "user", "host", "port", "password")},
        autocommit=True,
    )
    raw.execute(f"SET synchronous_commit TO {synchronous_commit}")
    return raw


def think(micros: list[int], block: int, blocks: int, synchronous_commit: str) -> dict[str, Any]:
    """The raw statement's wall time (the median of ``block``) after ``m`` microseconds of
    client CPU before each, for each ``m`` of ``micros`` in turn, ``blocks`` rounds."""
    raw = _raw_connection(synchronous_commit)
    counter = iter(range(10**9))
    walls: dict[int, list[float]] = {m: [] for m in micros}
    load = os.getloadavg()[0]
    for _ in range(blocks):
        raw.execute("DELETE FROM django_gator_job")
        for m in micros:
            times = []
            for _ in range(block):
                end = time.perf_counter() + m / 1e6
                while time.perf_counter() < end:
                    pass
                start = time.perf_counter()
                raw.execute(
                    RAW_SQL, ["raw.noop", json.dumps([next(counter)]), "{}", "raw", 0], prepare=True
                ).fetchone()
                times.append((time.perf_counter() - start) * 1e6)
            walls[m].append(round(statistics.median(times), 1))
    raw.execute("DELETE FROM django_gator_job")
    raw.close()
    return {"load": load, "block": block, "blocks": blocks, "wall_us": walls}


def run(url: str, block: int, blocks: int, synchronous_commit: str) -> dict[str, Any]:
    from django.db import connection
    from psycopg.pq import Format

    from django_gator.bench import QUEUE, BenchNoop
    from django_gator.engines import get_engine
    from django_gator.engines.postgresql_sessions import CHANNEL

    raw = _raw_connection(synchronous_commit)
    statement_cursor = raw.cursor()
    statement_cursor.format = Format.BINARY
    with connection.cursor() as cursor:
        cursor.execute(f"SET synchronous_commit TO {synchronous_commit}")
    engine: Any = get_engine("default")
    sql = engine._insert_one_sql((), False, True)
    counter = iter(range(10**9))

    def raw_one() -> None:
        raw.execute(
            RAW_SQL, ["raw.noop", json.dumps([next(counter)]), "{}", "raw", 0], prepare=True
        ).fetchone()

    def statement_one() -> None:
        statement_cursor.execute(
            sql,
            [BenchNoop.name, json.dumps([next(counter)]), "{}", QUEUE, 0, CHANNEL, QUEUE],
            prepare=True,
        )
        statement_cursor.fetchone()

    def dispatch_one() -> None:
        BenchNoop.dispatch(next(counter))

    calls: dict[str, Callable[[], None]] = {
        "raw": raw_one,
        "statement": statement_one,
        "dispatch": dispatch_one,
    }
    for call in calls.values():  # warm: psycopg prepares from the first run with prepare=True
        for _ in range(50):
            call()
    cpu: dict[str, list[float]] = {step: [] for step in STEPS}
    wall: dict[str, list[float]] = {step: [] for step in STEPS}
    ratios = []
    load = os.getloadavg()[0]
    for number in range(blocks):
        raw.execute("DELETE FROM django_gator_job")
        order = STEPS[number % len(STEPS) :] + STEPS[: number % len(STEPS)]
        for step in order:
            call = calls[step]
            cpu_start, wall_start = time.process_time(), time.perf_counter()
            for _ in range(block):
                call()
            wall[step].append((time.perf_counter() - wall_start) / block * 1e6)
            cpu[step].append((time.process_time() - cpu_start) / block * 1e6)
        ratios.append(round(wall["raw"][-1] / wall["dispatch"][-1], 3))
    raw.execute("DELETE FROM django_gator_job")
    raw.close()
    return {
        "load": load,
        "block": block,
        "blocks": blocks,
        "synchronous_commit": synchronous_commit,
        "cpu_us": {step: statistics.median(values) for step, values in cpu.items()},
        "wall_us": {step: statistics.median(values) for step, values in wall.items()},
        "dispatch_over_raw": ratios,
    }


if __name__ == "__main__":
    main()
