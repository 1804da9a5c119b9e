"""The CPU cost of encryption per job, on the code paths a job takes, without a database.

    python -m benchmarks.encryption --jobs 5000 --rounds 7

Alternately for a plain no-op class and the same with ``encrypted = True``
(``django_gator.bench``'s ``BenchNoop`` and ``BenchSecret``), in rounds whose order
alternates: the dispatch side (``pipeline.encoding.job_rows`` of one item: checks, JSON,
sealing of args and kwargs) and the worker side (``worker.execution.instance_for`` of a
claimed row, opening its args and kwargs; then ``stored_result`` of a small dict, which an
encrypted class seals). Time is the process's CPU time (``time.process_time``), which a
shared machine's other load disturbs less than wall time; the medians of the rounds are
printed in microseconds per job. The database's share of a job is measured by
``gator_bench --encrypted`` (see docs/benchmarks.md).

Uses the demo project's settings (``testproject/testproject/settings.py``), whose
``GATOR_ENCRYPTION_KEYS`` has a development key unless the environment gives others.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup() -> None:
    sys.path.insert(0, str(ROOT / "testproject"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ.setdefault("GATOR_LOG_LEVEL", "WARNING")
    import django

    django.setup()


def per_job(action: Callable[[int], object], jobs: int) -> float:
    """Microseconds of CPU per call of ``action(i)``, for ``jobs`` calls."""
    started = time.process_time()
    for i in range(jobs):
        action(i)
    return (time.process_time() - started) / jobs * 1e6


def measures(jobs: int) -> dict[str, Callable[[], float]]:
    from django_gator import encryption
    from django_gator.bench import BenchNoop, BenchSecret
    from django_gator.pipeline.encoding import job_rows
    from django_gator.rows import ClaimedJob
    from django_gator.worker.execution import instance_for, stored_result

    def dispatch(job_class: type) -> Callable[[], float]:
        return lambda: per_job(
            lambda i: job_rows(job_class, [([i], {})], None, None, None, None, None, False),
            jobs,
        )

    def run(job_class: type) -> Callable[[], float]:
        args: object = [12345]
        kwargs: object = {}
        if job_class.traits.encrypted:
            args = encryption.seal_value(args)
            kwargs = encryption.seal_value(kwargs)

        def one(i: int) -> None:
            row = ClaimedJob(i, job_class.name, args, kwargs, "q", 0, 1, 0)
            stored_result(row, instance_for(row), {"id": i, "sent": True})

        return lambda: per_job(one, jobs)

    return {
        "dispatch plain": dispatch(BenchNoop),
        "dispatch encrypted": dispatch(BenchSecret),
        "run plain": run(BenchNoop),
        "run encrypted": run(BenchSecret),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args()
    setup()
    variants = measures(options.jobs)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_number in range(options.rounds):
        order = names if round_number % 2 == 0 else names[::-1]
        for name in order:
            samples[name].append(variants[name]())
    medians = {name: statistics.median(values) for name, values in samples.items()}
    for name in names:
        shown = ", ".join(f"{v:.1f}" for v in samples[name])
        print(f"{name:<20} median {medians[name]:7.1f} us/job  (rounds: {shown})")
    for side in ("dispatch", "run"):
        added = medians[f"{side} encrypted"] - medians[f"{side} plain"]
        print(f"{side}: encryption adds {added:.1f} us of CPU per job")
    print(json.dumps({"jobs": options.jobs, "rounds": options.rounds, "medians": medians}))


if __name__ == "__main__":
    main()
