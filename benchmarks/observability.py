"""What metrics and tracing cost a drain: A/B rounds, alternated, in fresh processes.

    DATABASE_URL=... python -m benchmarks.observability --rounds 4 --drain 20000

Each round drains ``--drain`` no-op jobs with one burst worker (``django_gator.bench``'s
drain, 8 threads) in a new Python process, in one of these variants, taken in turn
(base, metrics, otel-noop, otel-sdk, base, metrics, ...):

- ``base``: prometheus_client and opentelemetry cannot be imported (the base install);
- ``metrics``: ``metrics.enable()``, as ``gator_worker --metrics-port`` does;
- ``otel-noop``: opentelemetry-api installed and no SDK configured;
- ``otel-sdk``: the SDK with a span processor that drops every span (the cost of making
  spans, without an exporter's).

It prints each round's jobs/s and each variant's median against base's. The database is
the test settings' (``tests.settings``; migrate it first).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("base", "metrics", "otel-noop", "otel-sdk")

ROUND = """
import json, sys
variant, count, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if variant == "base":
    sys.modules["prometheus_client"] = None
    sys.modules["opentelemetry"] = None
import django
django.setup()
if variant == "metrics":
    from django_gator import metrics
    metrics.enable()
if variant == "otel-sdk":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    provider = TracerProvider()
    provider.add_span_processor(SpanProcessor())
    trace.set_tracer_provider(provider)
from django_gator.bench import bench_drain
rate, _, _ = bench_drain(count, concurrency)
print(json.dumps(rate))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds of each variant")
    parser.add_argument("--drain", type=int, default=20_000, help="jobs per round")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    variants = args.variants.split(",")
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", GATOR_TEST_SUBPROCESS="1")
    env["PYTHONPATH"] = str(ROOT)
    rates: dict[str, list[float]] = {v: [] for v in variants}
    for round_ in range(args.rounds):
        for variant in variants:
            out = subprocess.run(
                [sys.executable, "-c", ROUND, variant, str(args.drain), str(args.concurrency)],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            rate = json.loads(out.strip().splitlines()[-1])
            rates[variant].append(rate)
            print(f"round {round_ + 1} {variant:10} {rate:8,.0f} jobs/s", flush=True)
    base = statistics.median(rates[variants[0]])
    for variant in variants:
        median = statistics.median(rates[variant])
        ratio = median / base
        print(f"{variant:10} median {median:8,.0f} jobs/s  ratio to {variants[0]} {ratio:.3f}")


if __name__ == "__main__":
    main()
