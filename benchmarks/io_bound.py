"""I/O-bound jobs as threads against async jobs on the event loop (issue 17).

Each job waits ``--sleep`` seconds (``time.sleep`` in a thread, ``asyncio.sleep`` on the
loop). One burst ``gator_worker`` process drains ``--jobs`` of them, alternately with
threads (``--concurrency 32``) and async (``--concurrency 1 --async-concurrency 500``),
``--rounds`` times each (A/B/A/B: the machine may be shared). Prints the drain time, the
rate and the worker's peak RSS for each run, and the ratios of the medians.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/gator_bench_io \\
        python benchmarks/io_bound.py --jobs 4000

Without DATABASE_URL a SQLite file in the temporary directory is used. The database is
migrated first; the benchmark's jobs (queue ``aio``) are deleted before each run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MODES = {
    "threads": ["--concurrency", "32"],
    "async": ["--concurrency", "1", "--async-concurrency", "500"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--sleep", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()

    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", GATOR_TEST_SUBPROCESS="1")
    env.setdefault(
        "DATABASE_URL", f"sqlite:///{Path(tempfile.gettempdir()) / 'gator-bench-io.sqlite3'}"
    )
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    from django_gator.models import Job
    from tests.testapp.jobs import AsyncSleep, ThreadSleep

    call_command("migrate", verbosity=0)
    results: dict[str, list[tuple[float, int]]] = {mode: [] for mode in MODES}
    for _ in range(options.rounds):
        for mode, args in MODES.items():
            Job.objects.filter(queue="aio").delete()
            job_class = AsyncSleep if mode == "async" else ThreadSleep
            job_class.dispatch_many([[options.sleep]] * options.jobs)
            command = [sys.executable, "-m", "django", "gator_worker", "--burst", "-q", "aio"]
            started = time.monotonic()
            proc = subprocess.Popen([*command, *args], cwd=ROOT, env=env)
            _, status, usage = os.wait4(proc.pid, 0)
            elapsed = time.monotonic() - started
            proc.returncode = os.waitstatus_to_exitcode(status)
            left = Job.objects.filter(queue="aio").exclude(state="succeeded").count()
            if proc.returncode or left:
                raise SystemExit(f"{mode}: exit {proc.returncode}, {left} jobs not succeeded")
            rss_mb = usage.ru_maxrss // 1024
            results[mode].append((elapsed, rss_mb))
            print(
                f"{mode:8} {' '.join(args):42} {options.jobs} jobs in {elapsed:6.2f} s "
                f"({options.jobs / elapsed:7.0f} jobs/s), peak RSS {rss_mb} MB",
                flush=True,
            )
    Job.objects.filter(queue="aio").delete()
    threads = statistics.median(t for t, _ in results["threads"])
    aio = statistics.median(t for t, _ in results["async"])
    print(f"median drain: threads {threads:.2f} s, async {aio:.2f} s: async {threads / aio:.1f}x")


if __name__ == "__main__":
    main()
