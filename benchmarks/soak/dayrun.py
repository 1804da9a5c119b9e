"""The harness's side of issue 32's day-in-an-hour run (day.py has the measures and checks):
its options, the throwaway cluster's production-like settings, partitioned storage, the
web-like dispatching processes (web.py) and what each minute's record gains."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from benchmarks.soak import day, measure, web
from benchmarks.soak.app import ledger
from benchmarks.soak.features import Check

if TYPE_CHECKING:
    from benchmarks.soak.harness import Soak


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--partitioning",
        choices=["none", "day", "hour"],
        default="none",
        help="partitioned storage (GATOR_PARTITIONING; the table is converted after migrate) "
        "or 'none': the plain table, DELETE pruning",
    )
    p.add_argument(
        "--notify",
        choices=["on", "off"],
        default="on",
        help="GATOR_NOTIFY in every process: 'off' wakes PostgreSQL's workers with datagrams",
    )
    p.add_argument(
        "--web", type=int, default=0, metavar="N", help="web-like dispatching processes (web.py)"
    )
    p.add_argument(
        "--web-share",
        type=float,
        default=0.6,
        help="share of --rate the web processes dispatch (with --web; the harness the rest)",
    )
    p.add_argument("--web-ways", type=web.ways, default=web.ways(web.DEFAULT_WAYS))
    p.add_argument(
        "--shared-buffers",
        default=None,
        help="throwaway cluster's shared_buffers (default: a quarter of RAM, at most 4GB)",
    )
    p.add_argument(
        "--growth-limit",
        type=float,
        default=day.GROWTH_LIMIT,
        help="claim p99 and size: last ten minutes at most this times the first ten after "
        "the first retention window (day checks)",
    )


def shared_buffers() -> str:
    """A quarter of the machine's memory (PostgreSQL's usual advice for a dedicated server),
    at most 4 GB: this machine is shared, and the queue's hot set (the active partition,
    or the plain table at 5 minutes' retention) is far smaller."""
    ram_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    return f"{min(ram_mb // 4, 4096)}MB"


def cluster_settings(args: argparse.Namespace) -> dict[str, str]:
    """Production-like settings for the throwaway cluster (autovacuum stays on)."""
    ram_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    return {
        "shared_buffers": f"'{args.shared_buffers or shared_buffers()}'",
        "effective_cache_size": f"'{ram_mb // 2}MB'",
        # A checkpoint every few minutes at a thousand jobs/s, not every few seconds.
        "max_wal_size": "'4GB'",
        "checkpoint_timeout": "'5min'",
        "max_connections": "200",
    }


def prepare_storage(partitioning: str) -> None:
    """Convert the jobs table to partitioned storage (after migrate, while empty), drop the
    kept plain table, and count deletions on the new parent as migration 0002 of the soak's
    app does on the plain one."""
    if partitioning == "none":
        return
    from django.core.management import call_command
    from django.db import connection

    call_command("gator_partitions", "--convert", "--granularity", partitioning, verbosity=0)
    call_command("gator_partitions", "--drop-backup", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TRIGGER gator_soak_count_deleted AFTER DELETE ON django_gator_job "
            "REFERENCING OLD TABLE AS gator_soak_old FOR EACH STATEMENT "
            "EXECUTE FUNCTION gator_soak_count_deleted()"
        )
    print(f"soak: jobs table converted to partitioned storage by {partitioning}", flush=True)


class WebFleet:
    """The web-like dispatching processes of a run."""

    def __init__(self, soak: Soak, args: argparse.Namespace) -> None:
        self.soak = soak
        self.args = args
        self.count = args.web
        self.share = args.web_share if args.web else 0.0
        if not 0 <= self.share <= 1:
            raise SystemExit(f"--web-share must be between 0 and 1, got {self.share}")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.offered = 0  # units the web processes dispatched (committed or rolled back)

    def start(self) -> None:
        soak = self.soak
        env = {**soak.worker_env(), "GATOR_SOAK_ROLE": "web"}
        ways = ",".join(f"{k}={v:g}" for k, v in self.args.web_ways.items() if k != "single")
        for index in range(self.count):
            command = [sys.executable, "-m", "benchmarks.soak.web", "--index", str(index)]
            command += ["--rate", f"{soak.rate * self.share / self.count:g}"]
            command += ["--duration", f"{soak.duration:g}", "--ways", ways]
            command += ["--seed", str(self.args.seed + 1000 + index)]
            with (soak.log_dir / f"web-{index}.log").open("wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        command, cwd=soak_root(), env=env, stdout=out, stderr=subprocess.STDOUT
                    )
                )

    def wait(self) -> None:
        deadline = time.monotonic() + 120
        for proc in self.procs:
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
        codes = [p.returncode for p in self.procs]
        if any(codes):
            raise RuntimeError(
                f"a web process failed (exit codes {codes}); see {self.soak.log_dir}"
            )

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def checks(self, reader: measure.TimingReader) -> list[Check]:
        """The ledger's check, after counting the committed web jobs in the expected
        outcomes (the harness's own check then counts them from the table too)."""
        if not self.count:
            return []
        directory = self.soak.timing_dir
        ledger.flush()
        dispatched = [row[0] for row in ledger.read(directory, "dispatched")]
        rolledback = [row[0] for row in ledger.read(directory, "rolledback")]
        runs = ledger.read(directory, "runs")
        self.soak.mixer.expected["soak.web"] = len(dispatched)
        self.offered = len(dispatched) + len(rolledback)
        reader.read()
        rescues = sum(len(b.get("rescue", [])) for b in reader.buckets.values())
        return [day.check_ledger(dispatched, rolledback, runs, rescues)]


def soak_root() -> str:
    from benchmarks.soak.harness import ROOT

    return str(ROOT)


def minute_extras(
    soak: Soak,
    cursor: Any,
    record: dict[str, Any],
    bucket: dict[str, list[tuple[float, int]]],
    state: dict[str, Any],
    end: datetime,
) -> dict[str, Any]:
    """What a minute's record gains: storage over partitions, time partitions and drops,
    the cluster's CPU per finished job, jobs done per second, web dispatches."""
    extras: dict[str, Any] = {}
    if measure.postgresql(cursor):
        extras["storage"] = day.storage(cursor, soak.vacuums)
        if soak.args.partitioning != "none":
            extras["partitions"] = sample_partitions(soak, cursor)
    if state["free_backlog"]:
        extras["free_backlog"] = {
            "due_max": max(d for d, _ in state["free_backlog"]),
            "oldest_s_max": round(max(a for _, a in state["free_backlog"]), 2),
        }
    jobs = record["finished"].get("succeeded", 0) + record["finished"].get("dead", 0)
    seconds = (end - datetime.fromisoformat(record["start"])).total_seconds() or 60.0
    extras["jobs_per_s"] = round(jobs / seconds, 1)
    extras["web_dispatched"] = sum(
        rows for kind in ("dispatch", "dispatch_many") for _, rows in bucket.get(kind, [])
    )
    if soak.postmaster and state.get("cluster_cpu") is not None:
        now = day.cluster_cpu(soak.postmaster)
        spent = (now or 0.0) - state["cluster_cpu"]
        extras["cluster_cpu_s"] = round(spent, 2)
        extras["cluster_cpu_us_per_job"] = round(spent * 1e6 / jobs) if jobs else None
    return extras


def sample_partitions(soak: Soak, cursor: Any) -> dict[str, Any]:
    """The ledger's look at the time partitions (every probe, and at each minute's end)."""
    from django_gator.engines.partitions import Partitions

    parts = Partitions("default").time_partitions()
    info = soak.partition_ledger.sample(cursor, parts, datetime.now(UTC))
    info["oldest"] = info["oldest"].isoformat() if info["oldest"] else None
    return info


def day_checks(soak: Soak, summary: dict[str, Any]) -> list[Check]:
    """The checks that fail a day run (see day.py), after its summary's figures."""
    from benchmarks.soak.harness import CLAIM_KINDS

    retention = soak.prune_after or 0.0
    warmup = retention + 1.5 * soak.args.prune_interval
    first, last = day.judged_windows(soak.minutes, warmup)
    pooled = (
        measure.pooled(soak.reader, [m["minute"] - 1 for m in first], CLAIM_KINDS),
        measure.pooled(soak.reader, [m["minute"] - 1 for m in last], CLAIM_KINDS),
    )
    summary["day"] = {
        "warmup_s": warmup,
        "claim_p99_first_last": [pooled[0]["p99"], pooled[1]["p99"]],
        "partition_drops": soak.partition_ledger.drops,
        "autovacuum_runs": soak.vacuums.totals()[0],
    }
    # Partitioned: the part claims read (the time partitions grow until they are dropped,
    # by design, and are bounded by check_drops and the row check; the dead jobs' by the jobs that
    # end dead, judged per dead job by check_dead_partition).
    size_key = "claimed_mb" if soak.args.partitioning != "none" else "total_mb"
    checks = [day.check_backlog(soak.minutes, soak.rate)]
    if soak.web.count:
        checks.append(
            day.check_offered(soak.web.offered, soak.rate * soak.web.share, soak.duration)
        )
    if soak.minutes and "storage" in soak.minutes[0]:
        checks += day.check_growth(
            soak.minutes,
            warmup,
            (pooled[0]["p99"], pooled[1]["p99"]),
            size_key,
            soak.args.growth_limit,
        )
        if soak.args.partitioning != "none":
            checks.append(day.check_dead_partition(soak.minutes, warmup, soak.args.growth_limit))
    if soak.args.partitioning != "none" and soak.prune_after is not None:
        checks.append(
            day.check_drops(
                soak.partition_ledger, retention, soak.args.prune_interval, datetime.now(UTC)
            )
        )
    return checks
