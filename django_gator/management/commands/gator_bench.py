"""``manage.py gator_bench``: measure dispatch, drain and pickup latency on this database."""

from __future__ import annotations

import os
import platform
from typing import Any

import django
from django.core.management.base import BaseCommand, CommandParser
from django.db import connections

from django_gator import conf, wording
from django_gator.management.arguments import WholeNumber

POSITIVE = WholeNumber(minimum=1)


class Command(BaseCommand):
    help = (
        "Benchmark django-gator on the configured database with no-op jobs. Writes jobs to "
        "the queue 'gator-bench' and deletes them afterwards."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dispatch", type=POSITIVE, default=2000, help="single dispatches")
        parser.add_argument(
            "--dispatch-many", type=POSITIVE, default=100_000, help="jobs via dispatch_many"
        )
        parser.add_argument("--batch", type=POSITIVE, default=10_000, help="dispatch_many size")
        parser.add_argument("--drain", type=POSITIVE, default=20_000, help="jobs to drain")
        parser.add_argument(
            "--concurrency", type=POSITIVE, default=8, help="executor threads of the drain's worker"
        )
        parser.add_argument("--latency", type=POSITIVE, default=200, help="latency samples")
        parser.add_argument(
            "--rounds", type=POSITIVE, default=7, help="alternate rounds of --only batch"
        )
        parser.add_argument(
            "--flow",
            choices=["none", "queue", "keys"],
            default="none",
            help="drain under flow control: queue (the queue limited to 1,000 running jobs, a "
            "limit that never binds) or keys (a class limited to 1 running job per key, over "
            "1,000 keys); none by default",
        )
        parser.add_argument(
            "--encrypted",
            action="store_true",
            help="dispatch and drain jobs of a class with encrypted = True (needs "
            "GATOR_ENCRYPTION_KEYS)",
        )
        parser.add_argument(
            "--only",
            choices=[
                "dispatch",
                "dispatch_many",
                "drain",
                "latency",
                "tasks",
                "batch",
                "batch_step",
            ],
            action="append",
            help="run only these measurements (repeatable)",
        )

    def handle(self, **options: Any) -> None:
        from django_gator import bench

        default = ["dispatch", "dispatch_many", "drain", "latency"]
        if conf.uses_tasks_backend():
            default.append("tasks")
        only = set(options["only"] or default)
        connection = connections[conf.database()]
        connection.ensure_connection()
        version = ".".join(map(str, connection.get_database_version()))
        self.stdout.write(
            f"django-gator benchmark: {connection.vendor} {version}, Django "
            f"{django.get_version()}, Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs, {platform.machine()}"
        )
        bench.clean()
        try:
            self._dispatches(options, only)
            if "batch" in only:
                self._compare(
                    options,
                    bench.bench_batch_dispatch(options["batch"], options["rounds"]),
                    f"dispatch_many of {options['batch']:,}: plain / in a Batch",
                    "in a Batch / plain, median",
                    "plain",
                    "Batch",
                )
            if "batch_step" in only:
                self._compare(
                    options,
                    bench.bench_batch_step_dispatch(options["batch"], options["rounds"]),
                    f"{options['batch']:,} jobs: in a Batch / as a batch step",
                    "batch step / Batch, median",
                    "Batch",
                    "batch step",
                )
            if "latency" in only:
                p50, p90 = bench.bench_latency(options["latency"], options["concurrency"])
                samples = wording.count(options["latency"], "sample")
                self._line(
                    f"pickup latency, commit to start ({samples})",
                    f"p50 {p50:.1f} ms, p90 {p90:.1f} ms",
                )
        finally:
            bench.clean()

    def _dispatches(self, options: dict[str, Any], only: set[str]) -> None:
        """The rates of dispatch (one at a time, dispatch_many), drain and tasks."""
        from django_gator import bench

        secret = options["encrypted"]
        kind = "encrypted " if secret else ""
        if "dispatch" in only:
            rate = bench.bench_dispatch(options["dispatch"], encrypted=secret)
            self._line(f"{kind}dispatch, one at a time (autocommit)", f"{rate:,.0f} jobs/s")
        if "dispatch_many" in only:
            rate = bench.bench_dispatch_many(
                options["dispatch_many"], options["batch"], encrypted=secret
            )
            self._line(f"{kind}dispatch_many, {options['batch']:,} per call", f"{rate:,.0f} jobs/s")
        if "drain" in only:
            rate, before, after = bench.bench_drain(
                options["drain"],
                options["concurrency"],
                options["batch"],
                flow=options["flow"],
                encrypted=secret,
            )
            flow = {"none": "", "queue": ", queue limit 1,000", "keys": ", 1,000 keys x 1"}
            self._line(
                f"drain {options['drain']:,} {kind}no-op jobs, 1 process, "
                f"{wording.count(options['concurrency'], 'thread')}{flow[options['flow']]}",
                f"{rate:,.0f} jobs/s (RSS {before:.0f} -> {after:.0f} MiB)",
            )
        if "tasks" in only:
            rate = bench.bench_task_enqueue(options["dispatch"])
            self._line("Task.enqueue(), one at a time (autocommit)", f"{rate:,.0f} tasks/s")
            rate = bench.bench_drain_tasks(
                options["drain"], options["concurrency"], options["batch"]
            )
            self._line(
                f"drain {options['drain']:,} no-op @task calls, 1 process, "
                f"{wording.count(options['concurrency'], 'thread')}",
                f"{rate:,.0f} tasks/s",
            )

    def _compare(
        self,
        options: dict[str, Any],
        rounds: list[tuple[float, float]],
        label: str,
        median: str,
        first: str,
        second: str,
    ) -> None:
        """Two ways of dispatching, alternately: each round's times, the median ratio of the
        second to the first; then the drains of the jobs dispatched each way."""
        for first_s, second_s in rounds:
            self._line(
                label,
                f"{first_s * 1000:.0f} / {second_s * 1000:.0f} ms (x{second_s / first_s:.2f})",
            )
        ratios = sorted(b / a for a, b in rounds)
        self._line(median, f"x{ratios[len(ratios) // 2]:.2f}")
        self._drains(options, first, second)

    def _drains(self, options: dict[str, Any], first: str, second: str) -> None:
        """Drain ``--drain`` jobs dispatched two ways ("plain", "Batch": its members, "batch
        step": a workflow's batch step's members), alternately, ``max(1, rounds / 3)``
        times; each pair's rates, and the median ratio of the second to the first."""
        from django_gator import bench

        ratios = []
        for _ in range(max(1, options["rounds"] // 3)):
            rates = [
                bench.bench_drain(
                    options["drain"],
                    options["concurrency"],
                    in_batch=how == "Batch",
                    in_step=how == "batch step",
                )[0]
                for how in (first, second)
            ]
            ratios.append(rates[1] / rates[0])
            self._line(
                f"drain {options['drain']:,}: {first} / {second}",
                f"{rates[0]:,.0f} / {rates[1]:,.0f} jobs/s (x{ratios[-1]:.2f})",
            )
        ratios.sort()
        self._line(f"drain, {second} / {first}, median", f"x{ratios[len(ratios) // 2]:.2f}")

    def _line(self, label: str, value: str) -> None:
        self.stdout.write(f"  {label:<55} {value}")
