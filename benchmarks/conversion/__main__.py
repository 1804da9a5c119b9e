"""``python -m benchmarks.conversion``: the online conversion of a large plain jobs table to
partitioned storage (``gator_partitions --convert``) while a worker claims and a web-like
process dispatches throughout (issue 32, item 1).

On a throwaway PostgreSQL 15 cluster (autovacuum on, 1 GB shared_buffers; or ``--cluster
shared`` with a database whose name contains ``soak``) it migrates, loads ``--rows`` jobs
(default 5,000,000) the way the admin-at-volume benchmark does (benchmarks/admin_volume/
fill.py: finished over ``--spread-days`` days, 98 % succeeded, 1 % each cancelled and dead,
and a few thousand unfinished), runs VACUUM ANALYZE (what autovacuum would have done), then
starts

- a worker process (``gator_worker -q conversion --concurrency N``, GATOR_PARTITIONING
  unset, as an install that has not converted yet; it is not restarted), and
- a dispatcher process (trickle.py) sending ``--rate`` single dispatches a second, each in
  autocommit,

waits ``--before`` seconds, converts in this process with the library call the command
makes (``Conversion.convert``), stamping each step it reports, waits ``--after`` seconds,
stops the dispatcher, waits for the worker to finish every dispatched job, and stops it.

It reports each step's duration (build, mirror trigger, the batches, the check, the swap and
its lock), and, for the jobs dispatched in each phase, the dispatch time and the pickup
(``started_at - created_at``: the claims' pause shows there) as p50 / p99 / max, the longest
gap between two successive job starts, and the checks: every dispatched job succeeded once
(attempts 1), the table holds every loaded row and every dispatched one, and no row went to
the default partition. Exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.admin_volume import fill
from benchmarks.soak.cluster import (
    ThrowawayCluster,
    end_on_sigterm,
    migrated_django,
    run_facts,
    server_facts,
    throwaway_arguments,
)
from benchmarks.soak.measure import quantile

ROOT = Path(__file__).resolve().parents[2]
DATABASE = "gator_soak_conversion"
PHASES = ("before", "build", "copy", "check", "swap", "after")


def load(rows: int, spread_days: float) -> dict[str, Any]:
    """The plain table's rows, then VACUUM ANALYZE; their count and the seconds each took."""
    from django.db import connection

    with connection.cursor() as cursor:
        load_s = fill.fill(cursor, rows, spread_days * 86400)
        started = time.monotonic()
        cursor.execute("VACUUM ANALYZE django_gator_job")
        vacuum_s = time.monotonic() - started
        cursor.execute(
            "SELECT count(*), pg_total_relation_size('django_gator_job') FROM django_gator_job"
        )
        count, size = cursor.fetchone()
    print(f"loaded {count:,} rows ({size / 2**30:.2f} GiB) in {load_s:.0f} s", flush=True)
    return {
        "rows": count,
        "size_gib": round(size / 2**30, 2),
        "load_s": round(load_s, 1),
        "vacuum_analyze_s": round(vacuum_s, 1),
    }


def start(module: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, *module], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def convert(granularity: str, batch_size: int) -> list[tuple[float, str]]:
    """Run the conversion; every step it reports, with the wall-clock time it came."""
    from django_gator.engines.partition_conversion import Conversion

    events: list[tuple[float, str]] = [(time.time(), "start")]

    def progress(message: str) -> None:
        events.append((time.time(), message))
        if not message.startswith("copied") or len(events) % 50 == 0:
            print(f"  {time.strftime('%H:%M:%S')} {message}", flush=True)

    Conversion("default").convert(granularity, batch_size=batch_size, progress=progress)
    events.append((time.time(), "done"))
    return events


def phase_bounds(events: list[tuple[float, str]], began: float, ended: float) -> dict[str, Any]:
    """Each phase's (start, end) wall-clock times, from the conversion's steps."""
    at = {message.split(" ")[0]: when for when, message in events}
    first = events[0][0]
    mirror = next(when for when, message in events if message.startswith("mirroring"))
    check, swap = at["checking"], at["swapping"]
    swapped = next(when for when, message in events if message.startswith("swapped"))
    return {
        "before": (began, first),
        "build": (first, mirror),
        "copy": (mirror, check),
        "check": (check, swap),
        "swap": (swap, swapped),
        "after": (swapped, ended),
    }


def steps(events: list[tuple[float, str]]) -> dict[str, Any]:
    """Durations of the conversion's steps, and of its batches."""
    batches = [when for when, message in events if message.startswith("copied")]
    mirror = next(when for when, message in events if message.startswith("mirroring"))
    gaps = sorted(b - a for a, b in zip([mirror, *batches], batches, strict=False))
    swap_message = next(message for _, message in events if message.startswith("swapped"))
    at = {message.split(" ")[0]: when for when, message in events}
    return {
        "total_s": round(events[-1][0] - events[0][0], 2),
        "build_s": round(at["built"] - events[0][0], 2) if "built" in at else None,
        "mirror_s": round(mirror - at.get("built", events[0][0]), 3),
        "copy_s": round(at["checking"] - mirror, 2),
        "batches": len(batches),
        "batch_p50_s": round(quantile(gaps, 0.5) or 0, 3),
        "batch_max_s": round(gaps[-1], 3) if gaps else None,
        "check_s": round(at["swapping"] - at["checking"], 3),
        "swap": swap_message,
    }


def jobs(ids: list[int]) -> dict[int, tuple[Any, ...]]:
    """Each dispatched job's row: state, attempts, rescues, created, started (epoch s)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, state, attempts, rescues, extract(epoch FROM created_at),"
            " extract(epoch FROM started_at) FROM django_gator_job WHERE id = ANY(%s)",
            [ids],
        )
        return {row[0]: row[1:] for row in cursor.fetchall()}


def ms(values: list[float]) -> dict[str, Any]:
    values = sorted(values)
    q = lambda p: None if not values else round(1000 * (quantile(values, p) or 0), 2)  # noqa: E731
    return {"n": len(values), "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": q(1.0)}


def phases(
    records: list[dict[str, Any]], rows: dict[int, tuple[Any, ...]], bounds: dict[str, Any]
) -> dict[str, Any]:
    """Per phase, for the jobs dispatched in it: dispatch time, pickup, the longest gap
    between two successive job starts (of any phase) that overlaps it."""
    starts = sorted(float(r[4]) for r in rows.values() if r[4] is not None)
    report: dict[str, Any] = {}
    for name in PHASES:
        low, high = bounds[name]
        mine = [r for r in records if low <= r["at"] < high and "id" in r]
        pickups = [
            float(rows[r["id"]][4]) - float(rows[r["id"]][3])
            for r in mine
            if r["id"] in rows and rows[r["id"]][4] is not None
        ]
        # Of the gaps between two successive starts, the longest that overlaps the phase.
        gap = max(
            (b - a for a, b in itertools.pairwise(starts) if b > low and a < high), default=None
        )
        report[name] = {
            "seconds": round(high - low, 3),
            "dispatch": ms([r["s"] for r in mine]),
            "pickup": ms(pickups),
            "longest_gap_between_starts_ms": None if gap is None else round(1000 * gap, 1),
        }
    return report


def checks(
    records: list[dict[str, Any]], rows: dict[int, tuple[Any, ...]], loaded: int
) -> dict[str, Any]:
    """What must hold, read from the database after the run (see verdict)."""
    from django.db import connection

    from django_gator.engines.partition_conversion import Conversion

    default = Conversion("default").names["default"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_gator_job")
        total = cursor.fetchone()[0]
        cursor.execute(f'SELECT count(*) FROM "{default}"')
        in_default = cursor.fetchone()[0]
    return verdict(records, rows, loaded, total, in_default)


def verdict(
    records: list[dict[str, Any]],
    rows: dict[int, tuple[Any, ...]],
    loaded: int,
    total: int,
    in_default: int,
) -> dict[str, Any]:
    """Every dispatch went through, every dispatched job is in the table, succeeded and ran
    once (attempts 1), the table holds the loaded rows and the dispatched ones, and none
    went to the default partition (``rows``: see jobs())."""
    ids = [r["id"] for r in records if "id" in r]
    result = {
        "dispatched": len(ids),
        "dispatch_errors": sum(1 for r in records if "error" in r),
        "missing": sum(1 for i in ids if i not in rows),
        "not_succeeded": sum(1 for r in rows.values() if r[0] != "succeeded"),
        "attempts_over_1": sum(1 for r in rows.values() if r[1] != 1),
        "rescues": sum(int(r[2]) for r in rows.values()),
        "rows_now": total,
        "rows_expected": loaded + len(ids),
        "rows_in_default_partition": in_default,
    }
    result["passed"] = (
        result["dispatch_errors"] == 0
        and result["missing"] == 0
        and result["not_succeeded"] == 0
        and result["attempts_over_1"] == 0
        and total == result["rows_expected"]
        and in_default == 0
    )
    return result


def wait_started(timeout: float) -> None:
    """Wait until the worker has run a dispatched job (it is up and claiming)."""
    from django.db import connection

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT EXISTS (SELECT 1 FROM django_gator_job WHERE queue = 'conversion'"
                " AND state = 'succeeded')"
            )
            if cursor.fetchone()[0]:
                return
        time.sleep(0.2)  # deliberate: polling the worker's first job
    raise SystemExit(f"the worker ran no job in {timeout:.0f} s: see its log")


def wait_finished(timeout: float) -> int:
    """Wait until no job of the queue is unfinished; returns how many still are."""
    from django.db import connection

    deadline = time.monotonic() + timeout
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM django_gator_job WHERE queue = 'conversion'"
                " AND state IN ('waiting', 'failed', 'running')"
            )
            left = int(cursor.fetchone()[0])
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(0.5)  # deliberate: polling the queue's end


def run(args: argparse.Namespace, url: str, work: Path) -> dict[str, Any]:
    os.environ["GATOR_SOAK_ROLE"] = "conversion"
    migrated_django(url, "benchmarks.soak.settings")
    from django.db import connection

    facts = run_facts(" ".join(sys.argv))
    table = load(args.rows, args.spread_days)
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "benchmarks.soak.settings"}
    worker = start(
        [
            "-m",
            "django",
            "gator_worker",
            "-q",
            "conversion",
            "--concurrency",
            str(args.concurrency),
        ],
        {**env, "GATOR_SOAK_ROLE": "worker"},
        work / "worker.log",
    )
    stop, out = work / "stop", work / "dispatches.jsonl"
    trickle = start(
        ["-m", "benchmarks.conversion.trickle", str(args.rate), str(out), str(stop)],
        {**env, "GATOR_SOAK_ROLE": "web"},
        work / "trickle.log",
    )
    try:
        wait_started(60)
        began = time.time()
        time.sleep(args.before)  # deliberate: the claims' pace before the conversion
        events = convert(args.granularity, args.batch_size)
        time.sleep(args.after)  # deliberate: and after it
        ended = time.time()
        stop.touch()
        trickle.wait(timeout=120)
        left = wait_finished(300)
    finally:
        stop.touch()
        worker.terminate()
        worker.wait(timeout=120)
        if trickle.poll() is None:
            trickle.kill()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    rows = jobs([r["id"] for r in records if "id" in r])
    with connection.cursor() as cursor:
        server = server_facts(cursor)
    return {
        **facts,
        "server": server,
        "table": table,
        "unfinished_at_end": left,
        "settings": vars(args) | {"out": str(args.out)},
        "steps": steps(events),
        "phases": phases(records, rows, phase_bounds(events, began, ended)),
        "checks": checks(records, rows, table["rows"]),
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| phase | seconds | jobs dispatched | dispatch p50 / p99 / max ms | pickup p50 / p99 /"
        " max ms | longest gap between starts ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, p in report["phases"].items():
        d, k = p["dispatch"], p["pickup"]
        lines.append(
            f"| {name} | {p['seconds']} | {d['n']} | {d['p50_ms']} / {d['p99_ms']} / "
            f"{d['max_ms']} | {k['p50_ms']} / {k['p99_ms']} / {k['max_ms']} | "
            f"{p['longest_gap_between_starts_ms']} |"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.conversion", description=__doc__)
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--spread-days", type=float, default=7.0, help="age of the oldest finished row")
    p.add_argument("--granularity", choices=["day", "hour"], default="day")
    p.add_argument("--batch-size", type=int, default=10_000, help="the conversion's")
    p.add_argument("--rate", type=float, default=200.0, help="single dispatches a second")
    p.add_argument("--concurrency", type=int, default=4, help="the worker's threads")
    p.add_argument("--before", type=float, default=20.0, help="seconds before the conversion")
    p.add_argument("--after", type=float, default=20.0, help="seconds after it")
    p.add_argument("--cluster", choices=["throwaway", "shared"], default="throwaway")
    p.add_argument("--database-url", default=f"postgres://postgres@127.0.0.1:5432/{DATABASE}")
    p.add_argument("--shared-buffers", default="1GB", help="of the throwaway cluster")
    throwaway_arguments(p, 5533)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    end_on_sigterm()
    args.out = args.out or ROOT / "benchmarks/results/conversion.json"
    cluster = None
    if args.cluster == "throwaway":
        settings = {"shared_buffers": f"'{args.shared_buffers}'", "max_wal_size": "'8GB'"}
        cluster = ThrowawayCluster(args.port, args.pg_bindir, settings)
        url = cluster.start(DATABASE)
    else:
        url = args.database_url
    try:
        with tempfile.TemporaryDirectory(prefix="gator-conversion-") as work:
            report = run(args, url, Path(work))
    finally:
        from django.db import connections

        connections.close_all()
        if cluster is not None:
            cluster.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(json.dumps(report["steps"], indent=1))
    print(markdown(report))
    print(json.dumps(report["checks"], indent=1))
    print(f"report: {args.out}")
    return 0 if report["checks"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
