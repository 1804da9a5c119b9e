"""``python -m benchmarks.processes``: drain CPU-bound jobs with ``gator_worker
--processes 1`` and ``--processes 2`` (and any other counts given), alternately.

Each run dispatches ``--jobs`` jobs of about ``--ms`` milliseconds of pure-Python work (the
loop count is calibrated on this machine first), starts ``python -m django gator_worker
--processes P --concurrency C --burst`` and waits for it to exit, sampling the resident
memory of the supervisor and of each worker process every 0.2 s. It reports, per run:

- *drain*: jobs per second from the first job's start to the last one's end (database
  times of the rows), which leaves out the processes' start-up;
- *wall*: the command's whole run, start-up and exit included;
- the largest RSS seen of the supervisor (``--processes`` above 1) and of each worker.

Runs alternate (1, 2, 1, 2, ...) so that a change in the machine's load hits both alike;
the summary gives each run's ratio to the run of ``--processes 1`` before it.

The database is ``--database-url`` (default: a new SQLite file in a temporary directory);
the benchmark migrates it and deletes the jobs of its queue (``cpu-bench``) before each run.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.soak.cluster import end_on_sigterm

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.processes", description=__doc__)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--ms", type=float, default=10.0, help="work per job, milliseconds")
    parser.add_argument(
        "--loops", type=int, default=0, help="work per job as a loop count (skips calibration)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2, help="threads per process")
    parser.add_argument(
        "--processes", type=int, nargs="+", default=[1, 2], help="process counts to compare"
    )
    parser.add_argument("--database-url", default="")
    options = parser.parse_args(argv)
    end_on_sigterm()  # through the finally blocks, which stop its worker

    url = options.database_url or f"sqlite:///{tempfile.mkdtemp()}/bench.sqlite3"
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.processes.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from benchmarks.processes.app.jobs import spin

    call_command("migrate", verbosity=0)
    loops = options.loops or calibrate(options.ms)
    print(
        f"processes benchmark {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, Django {django.get_version()}, "
        f"{connection.vendor}; {options.jobs:,} jobs of {loops:,} loops "
        f"({timed(lambda: spin(loops)) * 1000:.1f} ms here now), --concurrency "
        f"{options.concurrency}; load average at start {os.getloadavg()[0]:.1f}"
    )
    results: dict[int, list[float]] = {p: [] for p in options.processes}
    ratios: list[float] = []
    for round_ in range(1, options.rounds + 1):
        for count in options.processes:
            rate, wall, rss = run(count, options.jobs, loops, options.concurrency)
            results[count].append(rate)
            memory = ", ".join(f"{role} {size / MIB:.0f}" for role, size in rss)
            print(
                f"  round {round_} --processes {count}: drain {rate:,.0f} jobs/s, wall "
                f"{wall:.1f} s; RSS MiB: {memory}; load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            if count != options.processes[0] and results[options.processes[0]]:
                ratios.append(rate / results[options.processes[0]][-1])
    for count, rates in results.items():
        print(f"--processes {count}: median {statistics.median(rates):,.0f} jobs/s ({rates})")
    if ratios:
        print(f"ratio to the run before: {', '.join(f'{r:.2f}' for r in ratios)}")
    return 0


def calibrate(ms: float) -> int:
    """Loops of :func:`spin` that take ``ms`` milliseconds here (the best of 10 tries, so
    that another program's burst does not make the jobs shorter)."""
    from benchmarks.processes.app.jobs import spin

    probe = 200_000
    best = min(timed(lambda: spin(probe)) for _ in range(10))
    return max(1, int(probe * ms / 1000 / best))


def timed(action: object) -> float:
    started = time.perf_counter()
    action()  # type: ignore[operator]
    return time.perf_counter() - started


def run(count: int, jobs: int, loops: int, concurrency: int) -> tuple[float, float, list]:
    from django.db import connection
    from django.db.models import Max, Min

    from benchmarks.processes.app.jobs import QUEUE, CpuJob
    from django_gator.models import Job, JobState
    from django_gator.worker.limits import rss_bytes

    Job.objects.filter(queue=QUEUE).delete()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM ANALYZE {Job._meta.db_table}")
    for start in range(0, jobs, 1000):
        CpuJob.dispatch_many([[loops]] * min(1000, jobs - start))
    connection.close()
    command = [sys.executable, "-m", "django", "gator_worker", "-q", QUEUE, "--burst"]
    command += ["--processes", str(count), "--concurrency", str(concurrency)]
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    peak: dict[int, int] = {}
    try:
        while proc.poll() is None:
            for pid in [proc.pid, *children(proc.pid)]:
                peak[pid] = max(peak.get(pid, 0), rss_bytes(pid))
            time.sleep(0.2)
    finally:
        if proc.poll() is None:  # the benchmark was interrupted: stop the worker too
            proc.terminate()
            proc.wait()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"gator_worker exited {proc.returncode}")
    rows = Job.objects.filter(queue=QUEUE)
    done = rows.filter(state=JobState.SUCCEEDED).count()
    if done != jobs:
        raise SystemExit(f"{jobs - done} jobs did not succeed")
    span = rows.aggregate(first=Min("started_at"), last=Max("finished_at"))
    drain = (span["last"] - span["first"]).total_seconds()
    supervisor = [("supervisor", peak.pop(proc.pid, 0))] if count > 1 else []
    if count == 1:
        workers = [("worker", peak.pop(proc.pid, 0))]
    else:
        workers = [(f"worker {pid}", size) for pid, size in sorted(peak.items())]
    return jobs / drain, wall, supervisor + workers


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            found.append(int(entry.name))
    return found


if __name__ == "__main__":
    sys.exit(main())
