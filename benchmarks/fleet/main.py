"""``python -m benchmarks.fleet``: the ceiling of one PostgreSQL server, and a fleet of
worker hosts (issue 32 item 3). Needs root: the server runs as the postgres user, and the
fleet's hosts are network namespaces (netns.py).

- ``--part ceiling`` (ceiling.py): rates step up until the backlog is no longer bounded;
  the highest bounded rate, and what saturated;
- ``--part fleet`` (series.py): 1, 2, 4, 8, 12 worker processes over three network hosts,
  directly and through PgBouncer in transaction mode; throughput, claim p50/p99,
  connections per process, CPU; checks against a contention collapse;
- ``--part all``: both, on one throwaway cluster;
- ``--cleanup``: remove what an interrupted run left (namespaces, links, a pgbouncer,
  throwaway clusters), and exit.

The job is ``fleet.write`` (one row written per job; ``--job noop`` for none: app/jobs.py).
``--worker raw`` runs the fleet's steps with the control worker instead of gator_worker
(rawworker.py: the same database work in the fewest statements, no django-gator), directly
only, to tell the machine's part in the curve from django-gator's.
Writes a JSON report (``--out``) and a chart (``--chart``); exits 1 when ``--check`` is given
and a fleet check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.fleet import bouncer, netns

RESULTS = Path(__file__).resolve().parents[1] / "results"
DOCS = Path(__file__).resolve().parents[2] / "docs"


def numbers(kind: type, text: str) -> list[Any]:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError as error:
        message = f"not a comma-separated list of numbers: {text!r}"
        raise argparse.ArgumentTypeError(message) from error
    if not values or any(value <= 0 for value in values):
        raise argparse.ArgumentTypeError(f"give numbers above 0, not {text!r}")
    return values


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.fleet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--part", choices=("ceiling", "fleet", "all"), default="all")
    p.add_argument("--cleanup", action="store_true", help="remove leftovers and exit")
    p.add_argument("--job", choices=("write", "noop"), default="write")
    p.add_argument("--concurrency", type=int, default=4, help="threads per worker process")
    p.add_argument(
        "--worker",
        choices=("gator", "raw"),
        default="gator",
        help="the fleet's worker processes: gator_worker, or the control (rawworker.py)",
    )
    g = p.add_argument_group("the ceiling")
    g.add_argument(
        "--rates",
        type=lambda t: numbers(float, t),
        default=[200, 400, 600, 800, 1000, 1200, 1400, 1600, 2000, 2400],
    )
    g.add_argument("--hold", type=float, default=600.0, help="seconds per rate")
    g.add_argument(
        "--max-lag",
        type=float,
        default=5.0,
        help="bounded: the oldest due job younger than this (s) in the second half",
    )
    g.add_argument("--workers", type=int, default=2, help="worker processes for the ceiling")
    g = p.add_argument_group("the fleet")
    g.add_argument("--processes", type=lambda t: numbers(int, t), default=[1, 2, 4, 8, 12])
    g.add_argument("--hosts", type=int, default=3)
    g.add_argument("--modes", choices=("direct", "pgbouncer", "both"), default="both")
    g.add_argument("--backlog", type=int, default=3000, help="jobs kept waiting")
    g.add_argument("--step", type=float, default=120.0, help="seconds measured per step")
    g.add_argument("--warmup", type=float, default=10.0)
    g.add_argument("--pool-size", type=int, default=8, help="PgBouncer's default_pool_size")
    g.add_argument("--bouncer-port", type=int, default=6499)
    g.add_argument("--max-fall", type=float, default=0.10)
    g.add_argument("--claim-p99-max", type=float, default=250.0, help="ms")
    g.add_argument("--check", action="store_true", help="exit 1 if a fleet check fails")
    p.add_argument("--port", type=int, default=5498, help="port of the throwaway cluster")
    p.add_argument("--pg-bindir", default="/usr/lib/postgresql/15/bin")
    p.add_argument(
        "--out", type=Path, help="the JSON report (benchmarks/results/fleet[-control].json)"
    )
    p.add_argument("--chart", type=Path, help="the chart (docs/fleet[-control].png)")
    p.add_argument("--note", default="", help="a remark stored in the report (e.g. the load)")
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    return p


def outputs(options: argparse.Namespace) -> argparse.Namespace:
    """The report's and the chart's paths, unless given: the control's beside the fleet's
    (``fleet-control.json``), never over them."""
    suffix = "-control" if options.worker == "raw" else ""
    options.out = options.out or RESULTS / f"fleet{suffix}.json"
    options.chart = options.chart or DOCS / f"fleet{suffix}.png"
    return options


def preflight(options: argparse.Namespace) -> None:
    if options.worker == "raw" and (options.part != "fleet" or options.modes != "direct"):
        raise SystemExit("--worker raw is the fleet's control: give --part fleet --modes direct")
    if os.geteuid() != 0:
        raise SystemExit(
            "python -m benchmarks.fleet needs root: PostgreSQL runs as the postgres user and "
            "the fleet's hosts are network namespaces (CAP_NET_ADMIN); run it with sudo"
        )
    if options.part != "ceiling":
        reason = netns.missing()
        if reason:
            raise SystemExit(f"the fleet cannot run here: {reason}")
        if options.modes != "direct" and bouncer.binary() is None:
            raise SystemExit("no pgbouncer: apt-get install pgbouncer, or --modes direct")
    if not Path(options.pg_bindir, "initdb").exists():
        raise SystemExit(f"no initdb in --pg-bindir {options.pg_bindir!r}")


def main(argv: list[str] | None = None) -> int:
    options = outputs(parser().parse_args(argv))
    if options.cleanup:
        if os.geteuid() != 0:
            raise SystemExit("--cleanup needs root (network namespaces, the postgres user)")
        from benchmarks.fleet.runner import cleanup

        removed = cleanup()
        print("\n".join(f"removed {item}" for item in removed) or "nothing left to remove")
        return 0
    preflight(options)
    from benchmarks.fleet.runner import Bench
    from benchmarks.soak.cluster import end_on_sigterm

    end_on_sigterm()  # through the finally blocks, which remove the namespaces and clusters

    bench = Bench(options, hosts=options.hosts if options.part != "ceiling" else 0)
    report: dict[str, Any] = {"run": facts(options)}
    try:
        bench.open()
        report["run"]["server"] = server(bench)
        run_parts(bench, options, report)
    finally:
        bench.close()
    report["run"]["load_average_end"] = os.getloadavg()
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"report: {options.out}")
    if "fleet" in report:
        from benchmarks.fleet.chart import draw

        draw(report, options.chart)
        print(f"chart: {options.chart}")
    failed = [check for series in report.get("fleet", []) for check in series["checks"]]
    for check in failed:
        print(
            f"CHECK FAILED: {check['check']} at {check['processes']} processes: {check['detail']}"
        )
    return 1 if failed and options.check else 0


def run_parts(bench: Any, options: argparse.Namespace, report: dict[str, Any]) -> None:
    from benchmarks.fleet import ceiling, series

    if options.part in ("ceiling", "all"):
        print(
            f"the ceiling: {options.workers} workers x {options.concurrency} threads, "
            f"{options.hold:g} s per rate",
            flush=True,
        )
        report["ceiling"] = ceiling.run(bench, options)
        print(f"ceiling: {report['ceiling']['ceiling_rate']} jobs/s", flush=True)
    if options.part in ("fleet", "all"):
        modes = {"direct": [False], "pgbouncer": [True], "both": [False, True]}[options.modes]
        print(
            f"the fleet: {options.processes} processes over {options.hosts} hosts, "
            f"{options.concurrency} threads each, {options.step:g} s per step",
            flush=True,
        )
        report["fleet"] = [series.run(bench, options, pooled) for pooled in modes]


def facts(options: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.soak.cluster import run_facts

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        **run_facts(" ".join(sys.argv)),
        "commit": commit or None,
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(options).items()},
        "note": options.note,
    }


def server(bench: Any) -> dict[str, Any]:
    import django
    from django.db import connection

    from benchmarks.soak.cluster import server_facts

    with connection.cursor() as cursor:
        found = server_facts(cursor)
    found["django"] = django.get_version()
    found["pgbouncer"] = (
        subprocess.run(
            [bouncer.binary() or "", "--version"], capture_output=True, text=True
        ).stdout.splitlines()[:1]
        if bouncer.binary()
        else None
    )
    return found
