"""The cost of process isolation per job (issue 35): threads against isolated attempts.

One burst ``gator_worker`` process drains ``--jobs`` no-op jobs (queue ``isolated``, a job
that returns its pid), alternately in its threads and each in a child process forked from
its fork server (``--isolate-queue isolated``), ``--rounds`` times each (A/B/A/B: the
machine may be shared). The drain time includes the worker's start-up (and, isolated, the
fork server's, once per worker), so a few hundred jobs per run keep it small against the
per-job cost. Then, for reference, the cost of the alternative the worker does not use:
``--spawn`` children started with multiprocessing's ``spawn`` (a fresh interpreter that
sets Django up and runs one no-op), one after the other.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/gator_bench_iso \\
        python benchmarks/isolation.py --jobs 400

Without DATABASE_URL a SQLite file in the temporary directory is used. The database is
migrated first; the benchmark's jobs are deleted before each run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MODES = {
    "threads": [],
    "isolated": ["--isolate-queue", "isolated"],
}


def spawned_noop() -> None:
    """A spawned child: set Django up, as an isolated attempt's child would need."""
    import django

    django.setup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--spawn", type=int, default=10, help="spawned children to time")
    options = parser.parse_args()

    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", GATOR_TEST_SUBPROCESS="1")
    env.setdefault(
        "DATABASE_URL", f"sqlite:///{Path(tempfile.gettempdir()) / 'gator-bench-iso.sqlite3'}"
    )
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    from django_gator.models import Job
    from tests.testapp.isolated_jobs import Ordinary

    call_command("migrate", verbosity=0)
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(options.rounds):
        for mode, args in MODES.items():
            Job.objects.filter(queue="isolated").delete()
            Ordinary.dispatch_many([[n] for n in range(options.jobs)])
            command = [sys.executable, "-m", "django", "gator_worker", "--burst", "-q", "isolated"]
            command += ["--concurrency", str(options.concurrency), *args]
            started = time.monotonic()
            proc = subprocess.run(command, cwd=ROOT, env=env, check=False)
            elapsed = time.monotonic() - started
            left = Job.objects.filter(queue="isolated").exclude(state="succeeded").count()
            pids = set(Job.objects.filter(queue="isolated").values_list("result", flat=True))
            if proc.returncode or left:
                raise SystemExit(f"{mode}: exit {proc.returncode}, {left} jobs not succeeded")
            results[mode].append(elapsed)
            print(
                f"{mode:8} {options.jobs} jobs in {elapsed:6.2f} s "
                f"({options.jobs / elapsed:6.0f} jobs/s, {elapsed / options.jobs * 1000:6.2f} "
                f"ms per job), {len(pids)} distinct pids",
                flush=True,
            )
    Job.objects.filter(queue="isolated").delete()
    threads = statistics.median(results["threads"])
    isolated = statistics.median(results["isolated"])
    extra = (isolated - threads) / options.jobs * 1000
    print(
        f"median drain: threads {threads:.2f} s, isolated {isolated:.2f} s: "
        f"{extra:.2f} ms more per job (wall, {options.concurrency} threads)"
    )
    if options.spawn:
        context = multiprocessing.get_context("spawn")
        started = time.monotonic()
        for _ in range(options.spawn):
            child = context.Process(target=spawned_noop)
            child.start()
            child.join()
        each = (time.monotonic() - started) / options.spawn * 1000
        print(f"spawn (a fresh interpreter and django.setup() per job): {each:.0f} ms per child")


if __name__ == "__main__":
    main()
