"""What a tight loop of ``progress()`` calls costs (issue 35): a job calls
``self.progress(i, total=n)`` ``--calls`` times (100,000 by default) in a worker's thread;
the benchmark counts the writes the journal makes to the job's row and times the calls.
``--spin`` gives each iteration some busy work, so the loop lasts several intervals.

The writes are counted where they reach the engine (``save_progress``, one UPDATE each), so
the figure is what the database receives; the time per call is the loop's duration divided
by the calls, against the same loop without ``progress()`` (the difference is the call's
own cost). The job runs under a burst worker in this process, as a worker runs any job.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/gator_bench_progress \\
        python -m benchmarks.progress --calls 100000 --rounds 3

Without DATABASE_URL a SQLite file in the temporary directory is used (migrated first).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--spin", type=float, default=0.0, help="microseconds of busy work per iteration"
    )
    args = parser.parse_args(argv)
    if not os.environ.get("DATABASE_URL"):
        os.environ["DATABASE_URL"] = "sqlite:///" + str(
            Path(tempfile.gettempdir()) / "gator_bench_progress.sqlite3"
        )
    sys.path[:0] = [str(ROOT / "testproject"), str(ROOT)]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    for result in run(args.calls, args.rounds, args.spin / 1e6):
        print(result)
    return 0


def run(calls: int, rounds: int, spin: float = 0.0) -> list[str]:
    from django_gator import conf
    from django_gator.engines import get_engine
    from django_gator.models import Job, JobState
    from django_gator.queueable import Queueable
    from django_gator.worker.queues import parse_queue_specs
    from django_gator.worker.supervisor import WorkerProcess

    timings: dict[str, float] = {}

    class ProgressLoop(Queueable):
        queue = "bench-progress"

        def handle(self, n: int, report: bool) -> None:
            clock = time.perf_counter
            started = clock()
            for i in range(n):
                if spin:
                    until = clock() + spin
                    while clock() < until:
                        pass
                if report:
                    self.progress(i + 1, total=n, note="looping")
            timings["report" if report else "bare"] = time.perf_counter() - started

    engine_class = type(get_engine(conf.database()))
    original = engine_class.save_progress
    writes = {"n": 0}

    def counted(self: Any, *a: Any, **k: Any) -> Any:
        writes["n"] += 1
        return original(self, *a, **k)

    engine_class.save_progress = counted  # type: ignore[method-assign]
    lines = [
        f"progress() benchmark: {calls:,} calls per job ({spin * 1e6:g} us of work each), "
        f"GATOR_PROGRESS_INTERVAL "
        f"{conf.progress_interval():g} s, database {get_engine(conf.database()).vendor}"
    ]
    try:
        for round_ in range(1, rounds + 1):
            for report in (False, True):
                Job.objects.filter(queue="bench-progress").delete()
                writes["n"] = 0
                job = ProgressLoop.dispatch(calls, report)
                worker = WorkerProcess(
                    parse_queue_specs(["bench-progress"]),
                    concurrency=1,
                    burst=True,
                    install_signal_handlers=False,
                )
                worker.run()
                job.refresh_from_db()
                assert job.state == JobState.SUCCEEDED, (job.state, job.last_error)
                if report:
                    assert job.progress is not None
                    assert job.progress["done"] == calls, job.progress
                    seconds = timings["report"]
                    per_call = (seconds - timings["bare"]) / calls * 1e6
                    lines.append(
                        f"round {round_}: {calls:,} calls in {seconds:.2f} s "
                        f"({per_call:.2f} us a call over the bare loop), "
                        f"{writes['n']} writes to the row"
                    )
    finally:
        engine_class.save_progress = original  # type: ignore[method-assign]
    return lines


if __name__ == "__main__":
    sys.exit(main())
