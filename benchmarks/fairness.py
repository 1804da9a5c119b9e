"""Weighted fair share (docs/fairness.md): how soon small tenants are served beside a big
backlog, and what the fair claim costs against the ordinary one.

    DATABASE_URL=postgres://... python -m benchmarks.fairness --big 100000 --small 100 --rounds 7

*Served*: one tenant with ``--big`` queued jobs, then nine tenants with ``--small`` each, in
a fair queue (all weights 1). One claimer takes them ten at a time (the engine's claim, as a
worker's fetcher does), and for each of the nine the number of claims until its last job
was taken, and the seconds, are printed beside what the fair share predicts: with ten
tenants waiting, each gets a tenth of the claims, so a small tenant's last job is taken by
claim ``10 * small`` (a FIFO queue would take it after the big backlog, ``big + 9 * small``).

*Claim cost*: a fair queue and a plain queue of the same size (``--size`` jobs of ten
tenants, dispatched by the same class; ``--layout blocks``: each tenant's jobs in one run
of ids, so the fair claim's ten rows lie in ten places of the table where the plain claim's
are neighbours; ``interleaved``: one job of each tenant in turn), claimed ten at a time in
alternating rounds of ``--claims`` claims each (fair first in odd rounds, plain first in
even ones): each round's median microseconds per claim (the claim's statement and commit
alone), the median over the rounds, and their ratio. The claimed jobs are marked succeeded
in the same round (one UPDATE per claim, as a worker's batched marks), so the queues stay as
a worker leaves them.

Uses the demo project's settings (``testproject/testproject/settings.py``) on the database
of ``DATABASE_URL``, migrated first; the fair queue is set with ``override_settings``. The
benchmark's jobs (queues ``bench-fair``, ``bench-plain``) are deleted before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FAIR, PLAIN = "bench-fair", "bench-plain"
WORKER = "bench-fairness"


def setup() -> None:
    sys.path.insert(0, str(ROOT / "testproject"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ.setdefault("GATOR_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def clear() -> None:
    from django_gator.models import FairShare, Job

    Job.objects.filter(queue__in=[FAIR, PLAIN]).delete()
    FairShare.objects.filter(queue=FAIR).delete()


def fill(queue: str, tenant: str, count: int) -> None:
    from benchmarks.fairness_jobs import BenchTenant

    for start in range(0, count, 10_000):
        items = [[tenant, n] for n in range(start, min(count, start + 10_000))]
        BenchTenant.dispatch_many(items, queue=queue)


def claim_all(engine: Any, queue: str, claims: int) -> tuple[list[Any], float]:
    """``claims`` claims of ten (fewer if the queue runs dry), each followed by the
    success marks of what it took; the jobs taken and the median seconds of a claim
    (the claim's statement and commit alone, not the marks)."""
    from django_gator.attempts import Mark

    taken: list[Any] = []
    times: list[float] = []
    for _ in range(claims):
        started = time.perf_counter()
        jobs = engine.claim(WORKER, queue, 10)
        times.append(time.perf_counter() - started)
        if not jobs:
            break
        engine.mark_succeeded(WORKER, [Mark(j.id, j.attempts) for j in jobs])
        taken += jobs
    return taken, statistics.median(times)


def served(engine: Any, big: int, small: int) -> None:
    clear()
    fill(FAIR, "tenant:big", big)
    for i in range(9):
        fill(FAIR, f"tenant:{i}", small)
    left = {f"tenant:{i}": small for i in range(9)}
    finished: dict[str, tuple[int, float]] = {}
    claims = 0
    started = time.perf_counter()
    while left and claims < big:
        jobs, _ = claim_all(engine, FAIR, 1)
        if not jobs:
            break
        claims += 1
        for job in jobs:
            tenant = job.args[0]
            if tenant in left:
                left[tenant] -= 1
                if not left[tenant]:
                    del left[tenant]
                    finished[tenant] = (claims, time.perf_counter() - started)
    rate = claims / (time.perf_counter() - started)  # claims and their marks
    predicted = 10 * small / 10  # claims of ten: the tenant's tenth of 10 * small jobs
    fifo = (big + 9 * small) / 10
    print(f"served: {big:,} jobs of tenant:big, then 9 tenants x {small}; claims of 10")
    print(f"  claim rate {rate:,.0f} claims/s; fair share predicts claim {predicted:,.0f}")
    print(f"  ({predicted / rate:.2f} s at that rate); FIFO would finish at claim {fifo:,.0f}")
    for tenant in sorted(finished):
        count, seconds = finished[tenant]
        print(f"  {tenant}: last job at claim {count:,} ({seconds:.2f} s)")
    clear()


def fill_interleaved(queue: str, count: int) -> None:
    """``count`` jobs of ten tenants, one of each in turn (ids in the fair order)."""
    from benchmarks.fairness_jobs import BenchTenant

    for start in range(0, count, 10_000):
        items = [[f"tenant:{n % 10}", n] for n in range(start, min(count, start + 10_000))]
        BenchTenant.dispatch_many(items, queue=queue)


def claim_cost(engine: Any, size: int, claims: int, rounds: int, layout: str) -> None:
    clear()
    for queue in (FAIR, PLAIN):
        if layout == "interleaved":
            fill_interleaved(queue, size)
            continue
        for i in range(10):
            fill(queue, f"tenant:{i}", size // 10)
    per: dict[str, list[float]] = {FAIR: [], PLAIN: []}
    for index in range(rounds):
        order = (FAIR, PLAIN) if index % 2 == 0 else (PLAIN, FAIR)
        for queue in order:
            per[queue].append(claim_all(engine, queue, claims)[1] * 1e6)
    fair, plain = statistics.median(per[FAIR]), statistics.median(per[PLAIN])
    print(
        f"claim cost: {size:,} jobs per queue ({layout}), {rounds} rounds of {claims} claims of 10"
    )
    print(f"  fair  {fair:,.0f} us/claim  rounds {[round(v) for v in per[FAIR]]}")
    print(f"  plain {plain:,.0f} us/claim  rounds {[round(v) for v in per[PLAIN]]}")
    print(f"  fair / plain: {fair / plain:.3f}")
    clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", choices=("served", "cost"))
    parser.add_argument(
        "--layout",
        choices=("blocks", "interleaved"),
        default="blocks",
        help="the cost's queues: each tenant's jobs dispatched together (blocks of ids), or "
        "one job of each tenant in turn (ids in the fair order)",
    )
    options = parser.parse_args()
    setup()
    from django.db import connection
    from django.test import override_settings

    from django_gator import conf
    from django_gator.engines import get_engine

    engine = get_engine(conf.database())
    print(f"{connection.vendor}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    with override_settings(GATOR_FAIRNESS={FAIR: {}}):
        if options.only in (None, "served"):
            served(engine, options.big, options.small)
        if options.only in (None, "cost"):
            claim_cost(engine, options.size, options.claims, options.rounds, options.layout)


if __name__ == "__main__":
    main()
