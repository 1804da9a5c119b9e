"""What metrics and tracing cost a drain and a pickup: variants alternated, fresh processes.

    python -m benchmarks.observability --database-url postgres://.../gator_obs \\
        --rounds 3 --drain 20000 --samples 200

Each round runs every variant once, in turn (the order rotates from round to round), each
in a new Python process that drains ``--drain`` no-op jobs with one burst worker
(``django_gator.bench``'s drain, ``--concurrency`` threads; dispatch not timed), then
measures the pickup latency of ``--samples`` jobs dispatched one at a time to an idle
worker (commit to start, ``bench_latency``). The variants:

- ``base``: prometheus_client and opentelemetry cannot be imported (the base install);
- ``metrics``: what ``gator_worker --metrics-port`` does: ``metrics.enable()``, the
  worker's thread gauges, and ``/metrics`` served on a free port, scraped every second
  meanwhile (Prometheus usually scrapes every 15 s);
- ``otel-sdk``: the OpenTelemetry SDK with an exporter that counts the spans and drops
  them, behind a ``SimpleSpanProcessor``: every dispatch and every run makes a recorded
  span, exported on its end, and dispatch writes each row's trace context (an in-memory
  exporter would keep every span alive, and the garbage collector's passes over them
  would be measured too);
- ``otel-noop`` (not run unless named): opentelemetry-api installed and no SDK
  configured (non-recording spans).

Each process checks that its variant did what it says (spans exported, samples counted).
Besides the drain rate it reports the worker's CPU time per job (``time.process_time()``
of the worker process over the drain: its threads, not the database server's), which the
machine's other processes disturb far less than the rate. Prints each round's figures and,
per variant, the median and the spread (min-max) of each figure, and its median's ratio
to the first variant's. The database is migrated first
(``tests.settings``); give it a database of its own: the benchmark deletes its queue's rows
and VACUUMs the jobs table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("base", "metrics", "otel-sdk")
ALL_VARIANTS = (*VARIANTS, "otel-noop")

ROUND = """
import json, sys, threading, urllib.request
variant = sys.argv[1]
count, concurrency, samples = (int(a) for a in sys.argv[2:5])
if variant == "base":
    sys.modules["prometheus_client"] = None
    sys.modules["opentelemetry"] = None
import time
import django
django.setup()
check = {}
stop = threading.Event()
from django_gator.worker import supervisor
# The worker's CPU time (this process: its threads, not the database server's), which
# other processes on the machine disturb far less than the wall-clock rate.
cpu = []
run_worker = supervisor.WorkerProcess.run
def timed_run(self):
    started = time.process_time()
    try:
        return run_worker(self)
    finally:
        cpu.append(time.process_time() - started)
supervisor.WorkerProcess.run = timed_run
if variant == "metrics":
    from django_gator import metrics
    metrics.enable()
    server = metrics.serve(0, "127.0.0.1")
    scrapes = []
    def scrape():
        while not stop.wait(1.0):
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics") as r:
                scrapes.append(len(r.read()))
    threading.Thread(target=scrape, daemon=True).start()
    # As gator_worker --metrics-port does: report each worker's threads.
    run = supervisor.WorkerProcess.run
    def tracked(self):
        metrics.track(self.concurrency, lambda: len(self.slots.running))
        return run(self)
    supervisor.WorkerProcess.run = tracked
if variant == "otel-sdk":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult
    class Counting(SpanExporter):
        # Counts the spans and drops them: an in-memory exporter keeps every span alive,
        # and the garbage collector's passes over tens of thousands of them cost more
        # than the spans (about 15 us a span more, measured alone).
        def __init__(self):
            self.runs = self.spans = 0
        def export(self, spans):
            self.spans += len(spans)
            self.runs += sum(1 for s in spans if s.name.startswith("run "))
            return SpanExportResult.SUCCESS
    exporter = Counting()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
from django_gator.bench import bench_drain, bench_latency
rate, _, _ = bench_drain(count, concurrency)
p50, p90 = bench_latency(samples, concurrency)
stop.set()
if variant == "metrics":
    from prometheus_client import REGISTRY
    finished = sum(
        s.value for m in REGISTRY.collect() if m.name == "gator_jobs_finished"
        for s in m.samples if s.name == "gator_jobs_finished_total"
    )
    assert finished == count + samples, finished
    assert scrapes, "no scrape"
    check = {"finished_counted": finished, "scrapes": len(scrapes)}
    server.close()
if variant == "otel-sdk":
    assert exporter.runs == count + samples, exporter.runs
    check = {"run_spans": exporter.runs, "spans": exporter.spans}
figures = {"drain": rate, "drain_cpu_us_per_job": cpu[0] / count * 1e6}
figures |= {"pickup_p50_ms": p50, "pickup_p90_ms": p90}
print(json.dumps(figures | check))
"""

FIGURES = ("drain", "drain_cpu_us_per_job", "pickup_p50_ms", "pickup_p90_ms")


def run_round(variant: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            ROUND,
            variant,
            str(args.drain),
            str(args.concurrency),
            str(args.samples),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"variant {variant} failed:\n{out.stderr[-4000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each variant")
    parser.add_argument("--drain", type=int, default=20_000, help="jobs drained per round")
    parser.add_argument("--samples", type=int, default=200, help="pickup latency samples")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated, of {', '.join(ALL_VARIANTS)}",
    )
    parser.add_argument("--database-url", help="default: DATABASE_URL, else tests' SQLite")
    parser.add_argument("--out", type=Path, help="JSON report")
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in ALL_VARIANTS]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}; choose from {', '.join(ALL_VARIANTS)}")
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", GATOR_TEST_SUBPROCESS="1")
    env["PYTHONPATH"] = str(ROOT)
    if args.database_url:
        env["DATABASE_URL"] = args.database_url
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--verbosity", "0"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    loads: list[float] = []
    for round_ in range(args.rounds):
        shift = round_ % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            loads.append(os.getloadavg()[0])
            result = run_round(variant, args, env)
            results[variant].append(result)
            print(
                f"round {round_ + 1} {variant:9} drain {result['drain']:8,.0f} jobs/s  "
                f"{result['drain_cpu_us_per_job']:6.0f} µs CPU/job  "
                f"pickup p50 {result['pickup_p50_ms']:6.1f} ms  p90 "
                f"{result['pickup_p90_ms']:6.1f} ms  load {loads[-1]:.1f}",
                flush=True,
            )
    summary: dict[str, Any] = {}
    first = variants[0]
    for variant in variants:
        summary[variant] = {}
        for figure in FIGURES:
            values = [r[figure] for r in results[variant]]
            median = statistics.median(values)
            base = statistics.median(r[figure] for r in results[first])
            summary[variant][figure] = {
                "median": round(median, 2),
                "min": round(min(values), 2),
                "max": round(max(values), 2),
                "ratio": round(median / base, 3),
            }
        d, c = summary[variant]["drain"], summary[variant]["drain_cpu_us_per_job"]
        p = summary[variant]["pickup_p50_ms"]
        print(
            f"{variant:9} drain median {d['median']:8,.0f} ({d['min']:,.0f}-{d['max']:,.0f}) "
            f"x{d['ratio']:.3f}   CPU/job {c['median']:.0f} µs ({c['min']:.0f}-{c['max']:.0f}) "
            f"x{c['ratio']:.3f}   pickup p50 {p['median']:.1f} ms "
            f"({p['min']:.1f}-{p['max']:.1f}) x{p['ratio']:.3f}"
        )
    print(f"load average (1 min) at each round's start: {min(loads):.1f}-{max(loads):.1f}")
    if args.out:
        report = {"args": vars(args) | {"out": str(args.out)}, "loads": loads}
        report |= {"results": results, "summary": summary}
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
