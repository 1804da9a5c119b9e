"""``python -m benchmarks.worker_hot_path``: the worker's Python per job, without the
database: ``run_claimed`` of a no-op job, ``Outcomes.record`` of its success (left for the
batched mark), the success marks and the parameters of PostgreSQL's mark statement.

The drain benchmark (``gator_bench --only drain``) measures this plus the round trips and
the database's work, on a machine whose load moves its figures by a quarter; this isolates
the part a change to the outcome objects can move. It runs the same calls on older
commits, so two worktrees can be compared alternately::

    DJANGO_SETTINGS_MODULE=tests.settings DATABASE_URL=postgres://postgres@127.0.0.1:5432/x \\
        python -m benchmarks.worker_hot_path --jobs 1000 --repeat 15

No query is sent (``marks_sql`` only builds the statement); the database URL selects the
engine.
"""

from __future__ import annotations

import argparse
import time

import django


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=15)
    options = parser.parse_args()
    django.setup()

    from django_gator.engines import get_engine
    from django_gator.rows import ClaimedJob
    from django_gator.worker.execution import run_claimed
    from django_gator.worker.outcomes import Outcomes
    from tests.testapp.jobs import Noop

    engine = get_engine("default")
    outcomes = Outcomes(engine, "bench")
    jobs = [ClaimedJob(i, Noop.name, [], {}, "default", 0, 1, 0) for i in range(options.jobs)]

    def once() -> None:
        batch = []
        for job in jobs:
            outcome = run_claimed(job, "bench")
            outcomes.record(job, outcome, 1.0, batch=True)
            batch.append((job, outcome, 1.0))
        engine.marks_sql("bench", outcomes.marks(batch))  # type: ignore[attr-defined]

    once()  # warm up
    per_job = []
    for _ in range(options.repeat):
        started = time.process_time()
        once()
        per_job.append((time.process_time() - started) / len(jobs) * 1e6)
    per_job.sort()
    print(f"per job: min {per_job[0]:.1f} µs, median {per_job[len(per_job) // 2]:.1f} µs")


if __name__ == "__main__":
    main()
