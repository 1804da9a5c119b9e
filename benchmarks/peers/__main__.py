"""``python -m benchmarks.peers``: every peer, one after another, then the table and chart."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from benchmarks.peers.report import COLUMNS, chart, table

ROOT = Path(__file__).resolve().parents[2]
ORDER = [
    "django-gator", "celery-threads", "celery-prefork", "procrastinate", "django-q2",
    "django-tasks-db",
]  # fmt: skip


def recreate_database(url: str) -> None:
    """Drop and create the benchmark's database (its name must contain "peers")."""
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if "peers" not in name:
        raise SystemExit(f"the benchmark drops its database; {name!r} must contain 'peers'")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for dist in ("django-gator", "celery", "procrastinate", "django-q2", "django-tasks-db",
                 "Django", "psycopg", "redis"):  # fmt: skip
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            found[dist] = "not installed"
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__)
    parser.add_argument("--peers", default=",".join(ORDER), help="comma-separated subset")
    parser.add_argument("--processes", default="1,2", help="worker processes, e.g. 1,2")
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gator_peers"
        ),
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379")
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/peers.json")
    parser.add_argument("--chart", type=Path, default=ROOT / "docs/peers.png")
    args = parser.parse_args(argv)

    peers = [p for p in args.peers.split(",") if p]
    unknown = sorted(set(peers) - set(ORDER))
    if unknown:
        parser.error(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(ORDER)}")
    layouts = [int(p) for p in args.processes.split(",")]
    logdir = Path(tempfile.mkdtemp(prefix="gator-peers-"))
    print(f"worker logs in {logdir}", flush=True)
    results = []
    for name in peers:
        for processes in layouts:
            print(f"==> {name}, {processes} process(es)", flush=True)
            recreate_database(args.database_url)
            from benchmarks.peers.peers import PEERS

            env = {
                **os.environ,
                "BENCH_PEER": PEERS[name].app,
                "BENCH_PROCESSES": str(processes),
                "BENCH_DATABASE_URL": args.database_url,
                "BENCH_REDIS_URL": args.redis_url,
                "DJANGO_SETTINGS_MODULE": "benchmarks.peers.settings",
            }
            command = [sys.executable, "-m", "benchmarks.peers.driver", "--peer", name,
                       "--processes", str(processes), "--logdir", str(logdir)]  # fmt: skip
            if args.quick:
                command.append("--quick")
            proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
                results.append({"peer": name, "processes": processes, "note": "", "figures": {},
                                "remarks": [f"failed: exit {proc.returncode}"]})  # fmt: skip
                continue
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            results.append(result)
            print(table([result]), flush=True)
    report = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "python": platform.python_version(),
        "database": f"PostgreSQL at {urlsplit(args.database_url).hostname}",
        "versions": versions(),
        "quick": args.quick,
        "columns": COLUMNS,
        "results": results,
    }  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print()
    print(table(results))
    print(f"\nJSON: {args.json}")
    if chart(report, args.chart):
        print(f"chart: {args.chart}")
    return 1 if any(r["remarks"] and r["remarks"][0].startswith("failed") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
